"""A GGUF quantized again, smaller, with llama.cpp's own quantizer
(``llama_cpp.llama_model_quantize``): fewer pieces to carry to a GPU machine
(docs/vllm.md, "A 7B reasoning model on one visit"). Requantizing an already quantized model
(Q4_K_M to Q3_K_M) loses more than quantizing the original weights would: check the result
answers sanely first (benchmarks/reasoning_model.py on it) before carrying it.

usage: python scripts/gguf_quantize.py IN.gguf OUT.gguf TYPE [--threads 2]
  TYPE: a llama.cpp file type without its prefix, e.g. Q3_K_M, Q3_K_S, Q2_K, Q8_0
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dest", type=Path)
    ap.add_argument("type", help="e.g. Q3_K_M")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    import llama_cpp

    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{a.type.upper()}", None)
    if ftype is None:
        known = sorted(n[len("LLAMA_FTYPE_MOSTLY_") :] for n in dir(llama_cpp)
                       if n.startswith("LLAMA_FTYPE_MOSTLY_"))  # fmt: skip
        print(f"gguf_quantize: unknown type {a.type}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    if not a.src.is_file():
        print(f"gguf_quantize: {a.src} does not exist", file=sys.stderr)
        return 2
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = a.threads
    params.allow_requantize = True  # the source is a quantized GGUF
    t0 = time.perf_counter()
    rc = llama_cpp.llama_model_quantize(str(a.src).encode(), str(a.dest).encode(), params)
    seconds = time.perf_counter() - t0
    if rc != 0 or not a.dest.is_file():
        print(f"gguf_quantize: llama.cpp's quantizer failed (status {rc})", file=sys.stderr)
        return 1
    print(json.dumps({"src": str(a.src), "src_bytes": a.src.stat().st_size, "dest": str(a.dest),
                      "dest_bytes": a.dest.stat().st_size, "type": a.type.upper(),
                      "seconds": round(seconds, 1)}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
