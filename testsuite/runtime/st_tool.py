"""st_tool.py: safetensors files for the runtime tests, written and read
with nothing but the standard library (independent of novarun's reader).

  st_tool.py write FILE SPEC   SPEC: JSON {"NAME": ["f32", [dims], [values]], ...,
                                "__metadata__": {"k": "v"}}; tensors in SPEC order
  st_tool.py print FILE        one line per tensor, 'NAME DTYPE [DIMS] V0 V1 ...', in
                               header order, then 'meta KEY VALUE' per metadata entry
"""
import json
import struct
import sys

FORMATS = {"f32": ("F32", "f"), "f64": ("F64", "d"), "i32": ("I32", "i"), "i64": ("I64", "q"),
           "bool": ("BOOL", "?")}
BY_ST = {v[0]: (k, v[1]) for k, v in FORMATS.items()}


def write(path, spec):
    header, data = {}, b""
    if "__metadata__" in spec:
        header["__metadata__"] = spec["__metadata__"]
    for name, entry in spec.items():
        if name == "__metadata__":
            continue
        dtype, dims, values = entry
        st, fmt = FORMATS[dtype]
        raw = struct.pack("<%d%s" % (len(values), fmt), *values)
        header[name] = {"dtype": st, "shape": dims, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def show(path):
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    for name, e in header.items():
        if name == "__metadata__":
            continue
        dtype, fmt = BY_ST[e["dtype"]]
        b, end = e["data_offsets"]
        size = struct.calcsize("<" + fmt)
        vals = struct.unpack("<%d%s" % ((end - b) // size, fmt), data[b:end])
        text = ["%.9g" % v if dtype.startswith("f") else "%d" % v for v in vals]
        print(" ".join([name, dtype, "[" + ",".join(str(d) for d in e["shape"]) + "]"] + text))
    for k, v in header.get("__metadata__", {}).items():
        print("meta", k, v)


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2], json.loads(sys.argv[3]))
    else:
        show(sys.argv[2])
