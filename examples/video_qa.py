"""Ask a question about a video.

    python examples/video_qa.py VIDEO "What happens?" --model CHECKPOINT_DIR
    python examples/video_qa.py VIDEO "What happens?" --url http://127.0.0.1:8000/v1

VIDEO is a path or an http(s)/data: URL. With --url the server reads a local path itself,
so start it with --allowed-media-dir covering the file's directory.
"""
import sys

from qa_common import main

if __name__ == "__main__":
    sys.exit(main(__doc__, "video"))
