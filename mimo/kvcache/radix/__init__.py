"""The prefix cache: the SWA-aware radix tree (tree.py, its rules), the SWA retention
policies, the cache namespace, and the scheduler's view of a prefix cache (PrefixCache,
RadixPrefixCache). docs/architecture.md has the tour."""
