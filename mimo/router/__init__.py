"""Cache-aware router: `python -m mimo.router --worker URL ... [--redis URL]`.

Workers (`server.py --router-redis URL`) publish the page keys their prefix trees and tiers
hold and their load (engine/cache_publisher.py); the router tokenizes each request itself
(prompt.py; images of data: URLs keyed as the worker keys them, media.py), predicts each
worker's window-safe cached length from those keys, host tier and shared store included,
and the credit the score gives it (policy.py), reads the
shared state in Redis (state.py), scores, forwards with retries (proxy.py). Replicas keep no
state of their own that matters: any replica, or a restarted one, decides alike.
"""
