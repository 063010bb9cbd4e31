"""Ask a question about an image.

    python examples/image_qa.py IMAGE "What is in this picture?" --model CHECKPOINT_DIR
    python examples/image_qa.py IMAGE "What is in this picture?" --url http://127.0.0.1:8000/v1

IMAGE is a path or an http(s)/data: URL. With --url the server reads a local path itself,
so start it with --allowed-media-dir covering the file's directory.
"""
import sys

from qa_common import main

if __name__ == "__main__":
    sys.exit(main(__doc__, "image"))
