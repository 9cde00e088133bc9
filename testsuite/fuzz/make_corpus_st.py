"""make_corpus_st.py DIR: the seeds of fuzz_st.c, safetensors files written by
hand (8-byte little-endian header length, the JSON header, the data section)
with numpy for the tensors' bytes: valid files of every dtype novarun reads,
checkpoints as novarun --save writes them, and edge cases its reader refuses."""
import json
import os
import struct
import sys

import numpy as np

DT = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64, "I32": np.int32,
      "I16": np.int16, "I8": np.int8, "U64": np.uint64, "U32": np.uint32, "U16": np.uint16,
      "U8": np.uint8, "BOOL": np.bool_}


def blob(tensors, meta=None, pad=True, header=None, trailing=b""):
    """tensors: [(name, st_dtype, shape, bytes)] at consecutive offsets."""
    h, data = {}, b""
    if meta is not None:
        h["__metadata__"] = meta
    for name, dt, shape, raw in tensors:
        h[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = header if header is not None else json.dumps(h, separators=(",", ":")).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data + trailing


def arr(dt, shape, seed=0):
    rng = np.random.default_rng(seed)
    if dt == "BF16":
        return (rng.standard_normal(shape).astype(np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
    if dt == "BOOL":
        return (rng.integers(0, 2, shape) != 0).tobytes()
    t = DT[dt]
    if np.issubdtype(t, np.floating):
        return rng.standard_normal(shape).astype(np.dtype(t).newbyteorder("<")).tobytes()
    return rng.integers(0, 100, shape).astype(np.dtype(t).newbyteorder("<")).tobytes()


def cases():
    ck = {"format": "novac", "graph_hash": "0123456789abcdef", "step": "3"}
    yield "checkpoint", blob([("w", "F32", (3,), arr("F32", (3,))), ("emb", "F32", (5,), arr("F32", (5,), 1)),
                              ("runs", "F32", (1,), arr("F32", (1,), 2))], ck)
    yield "checkpoint_adam", blob([("fc.weight", "F32", (4, 3), arr("F32", (4, 3))),
                                   ("fc.weight.m", "F32", (4, 3), arr("F32", (4, 3), 1)),
                                   ("fc.weight.v", "F32", (4, 3), arr("F32", (4, 3), 2)),
                                   ("fc.bias", "F32", (4,), arr("F32", (4,), 3))], ck)
    yield "data_batches", blob([("x", "F32", (4, 3), arr("F32", (4, 3))), ("lbl", "I32", (4,), arr("I32", (4,))),
                                ("idx", "I64", (4,), arr("I64", (4,)))])
    for dt in ["F32", "F64", "F16", "BF16", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL"]:
        yield "dtype_" + dt.lower(), blob([("t", dt, (2, 3), arr(dt, (2, 3)))])
    yield "scalar", blob([("s", "F32", (), arr("F32", ()))])
    yield "empty_tensor", blob([("e", "F32", (0, 4), b""), ("f", "F32", (2,), arr("F32", (2,)))])
    yield "no_tensors", blob([], {"k": "v"})
    yield "empty_header", blob([], header=b"{}")
    yield "rank_9", blob([("r", "U8", (1,) * 9, b"\0")])
    yield "unpadded", blob([("t", "F32", (3,), arr("F32", (3,)))], pad=False)
    yield "metadata_not_string", blob([("t", "F32", (1,), arr("F32", (1,)))], {"step": 3})
    yield "bad_dtype", blob([("t", "F8", (1,), b"\0")])
    yield "offsets_mismatch", blob([], header=b'{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}') + b"\0" * 4
    yield "overlap", blob([], header=b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                                     b'"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}') + b"\0" * 12
    yield "duplicate_name", blob([], header=b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                                            b'"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}') + b"\0\0"
    yield "trailing_bytes", blob([("t", "U8", (2,), b"\1\2")], trailing=b"junk")
    yield "truncated_data", blob([("t", "F64", (4,), arr("F64", (4,)))])[:-9]
    yield "huge_shape", blob([], header=b'{"t":{"dtype":"F32","shape":[4294967296,4294967296],'
                                        b'"data_offsets":[0,0]}}')
    yield "big_number", blob([], header=b'{"t":{"dtype":"F32","shape":[1e300],"data_offsets":[0,1e300]}}')
    yield "header_len_too_big", struct.pack("<Q", 1 << 62) + b"{}"
    yield "header_not_object", blob([], header=b"[1,2,3]")
    yield "header_bad_json", blob([], header=b'{"t":{"dtype":"F32",')
    yield "text_after_header", blob([], header=b"{} x")
    yield "nested", blob([], header=b'{"t":' + b"[" * 200 + b"]" * 200 + b"}")
    yield "short", b"\x02\0\0\0"


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, data in cases():
        with open(os.path.join(out, name + ".safetensors"), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
