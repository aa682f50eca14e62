"""The libFuzzer target's seed corpus: ModelInferRequest messages from the request generators
(s2t/gate/hostile_requests.py), valid and hostile, one file a message, named for its seed and index.

    python native/fuzz/seed_corpus.py DIR [COUNT]
"""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from s2t.gate.hostile_requests import grpc_request  # noqa: E402 - after the checkout is on the path
from tests.integration.edge.grpc_messages import wire  # noqa: E402
from tests.integration.edge.served_models import fuzzed_models  # noqa: E402

SEED = 20261206
# Records shaped as clients send them; the checks never read a payload's content, only its framing.
RECORDS = (b'{"request_id": "r-1", "features": {"age": 35, "purpose": "car (new)"}}', b'{"features": {}}', b"")


def main(folder: str, count: int = 500) -> None:
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    models = fuzzed_models()
    written = set()
    for index in range(count):
        data = wire(grpc_request(models, RECORDS, SEED, index))
        digest = hashlib.sha1(data).hexdigest()[:12]
        if digest not in written:
            (out / f"seed{SEED}-{index:05d}-{digest}").write_bytes(data)
            written.add(digest)
    print(f"{len(written)} seed messages in {out}")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
