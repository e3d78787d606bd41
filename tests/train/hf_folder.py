"""safetensors files and transformers model folders, read with numpy, for test_hf_folders.sh.

usage: python3 hf_folder.py COMMAND ARGS
  same A B                  the same tensors (names, dtypes, shapes, bytes); A, B files or folders
  folder DIR DTYPE FILES [--has NAME=D0,D1 ...] [--lacks NAME ...]
                            every tensor of DTYPE, in FILES weight files (with an index that maps
                            every tensor and gives the total size when FILES > 1)
  widened BF16 FP32         the bf16 folder holds the fp32 folder's values rounded to nearest even
  add-tensor DIR NAME FROM  rewrites DIR/model.safetensors with NAME, a copy of tensor FROM
  config DIR KEY=JSON ...   config.json holds these values
  set-config DIR KEY JSON   changes one key of config.json
"""
import json
import os
import struct
import sys

import numpy as np


def read_file(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header, data = json.loads(f.read(n)), f.read()
    meta = header.pop("__metadata__", {})
    return {k: (v["dtype"], tuple(v["shape"]), data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items()}, meta


def weight_files(d):
    if os.path.exists(os.path.join(d, "model.safetensors")):
        return ["model.safetensors"], None
    index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    return sorted(set(index["weight_map"].values())), index


def read(path):
    if not os.path.isdir(path):
        return read_file(path)[0]
    out = {}
    for f in weight_files(path)[0]:
        out.update(read_file(os.path.join(path, f))[0])
    return out


def write_file(path, tensors):
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for k, (dtype, shape, data) in tensors.items():
        header[k] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(t[2] for t in tensors.values()))


def main(cmd, *args):
    if cmd == "same":
        a, b = read(args[0]), read(args[1])
        assert a.keys() == b.keys(), (sorted(set(a) ^ set(b)))
        bad = [k for k in a if a[k] != b[k]]
        assert not bad, f"{len(bad)} tensors differ, the first {bad[0]}: {a[bad[0]][:2]} {b[bad[0]][:2]}"
        print(f"same {len(a)} tensors")
    elif cmd == "folder":
        d, dtype, count = args[0], args[1], int(args[2])
        files, index = weight_files(d)
        tensors = read(d)
        assert len(files) == count, files
        if count > 1:
            assert sorted(index["weight_map"]) == sorted(tensors), "the index maps other tensors"
            assert index["metadata"]["total_size"] == sum(len(t[2]) for t in tensors.values())
            for k, f in index["weight_map"].items():
                assert k in read_file(os.path.join(d, f))[0], (k, f)
        for f in files:
            assert read_file(os.path.join(d, f))[1] == {"format": "pt"}, f
        assert {t[0] for t in tensors.values()} == {dtype}, {t[0] for t in tensors.values()}
        mode = None
        for a in args[3:]:
            if a in ("--has", "--lacks"):
                mode = a
            elif mode == "--has":
                name, shape = a.split("=")
                assert name in tensors, name
                assert tensors[name][1] == tuple(int(x) for x in shape.split(",")), tensors[name][1]
            else:
                assert a not in tensors, a
        print(f"{len(tensors)} {dtype} tensors in {files}")
    elif cmd == "widened":
        half, full = read(args[0]), read(args[1])
        assert half.keys() == full.keys()
        for k in full:
            x = np.frombuffer(full[k][2], dtype=np.uint32)
            rounded = ((x + 0x7FFF + ((x >> 16) & 1)) >> 16).astype(np.uint16)
            assert half[k][0] == "BF16" and half[k][1] == full[k][1], k
            assert np.array_equal(np.frombuffer(half[k][2], dtype=np.uint16), rounded), k
        print(f"{len(full)} bf16 tensors are the fp32 ones rounded to nearest even")
    elif cmd == "add-tensor":
        path = os.path.join(args[0], "model.safetensors")
        tensors = read_file(path)[0]
        tensors[args[1]] = tensors[args[2]]
        write_file(path, tensors)
    elif cmd == "config":
        config = json.load(open(os.path.join(args[0], "config.json")))
        for a in args[1:]:
            key, value = a.split("=", 1)
            assert config.get(key) == json.loads(value), (key, config.get(key), value)
    elif cmd == "set-config":
        path = os.path.join(args[0], "config.json")
        config = json.load(open(path))
        config[args[1]] = json.loads(args[2])
        json.dump(config, open(path, "w"), indent=2)
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main(*sys.argv[1:])
