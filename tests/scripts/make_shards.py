#!/usr/bin/env python3
"""Writes and edits llm.c token shards for the data tests, without prep.

A shard: 256 little-endian int32 (magic 20240520, version 1, token count,
vocab size, tokenizer (0 unknown, 1 byte, 2 gpt2), vocab hash lo/hi, CRC-32
of the token bytes, 1 when slot 7 holds it), then uint16 tokens; with
--width 4, llm.c's Llama 3 shard: magic 20240801, version 7, uint32 tokens.

  make_shards.py text OUT N [--skip K] [--vocab V] [--tokenizer K] [--no-crc]
                 [--width 4] [--add A]
      N byte tokens of the fortunes text (from byte K of it, wrapping), each
      plus A
  make_shards.py many PREFIX COUNT N [--vocab V]
      COUNT shards PREFIX000000.bin... of N tokens each, each another slice
  make_shards.py sparse OUT N [--vocab V]
      a header promising N tokens and a sparse file of that size (zeros)
  make_shards.py poke OUT OFFSET TOKEN...
      writes tokens at token OFFSET (the header's CRC is left as it is)
  make_shards.py slot OUT SLOT VALUE
      sets one header slot
  make_shards.py sample SEED N SEQ
      the sample g of epoch 0 of a one-dataset run (seed SEED, N sequences)
      that reads sequence SEQ: the inverse of the order of src/data/dataset.c
      (ds_permute keyed as ds_locate keys it, rng_u64 of src/base/rng.c)
"""
import array
import glob
import os
import struct
import sys
import zlib

HDR = 1024
FORMATS = {2: (20240520, 1, "H"), 4: (20240801, 7, "I")}  # width: magic, version, array type
FORTUNES = os.environ.get("FORTUNES_DIR", "/usr/share/games/fortunes")


def text_bytes():
    files = sorted(f for f in glob.glob(os.path.join(FORTUNES, "*"))
                   if os.path.isfile(f) and not f.endswith((".dat", ".u8")))
    data = b"".join(open(f, "rb").read() for f in files)
    if not data:
        sys.exit("make_shards: no fortunes text under " + FORTUNES)
    return data


def header(n, vocab=256, tokenizer=1, crc=None, width=2):
    h = [0] * 256
    h[0:5] = [FORMATS[width][0], FORMATS[width][1], n, vocab, tokenizer]
    if crc is not None:
        h[7] = struct.unpack("<i", struct.pack("<I", crc & 0xFFFFFFFF))[0]
        h[8] = 1
    return struct.pack("<256i", *h)


def packed(toks, width):
    a = array.array(FORMATS[width][2], list(toks))
    assert a.itemsize == width
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


def write_tokens(path, toks, vocab=256, tokenizer=1, crc=True, width=2):
    raw = packed(toks, width)
    with open(path, "wb") as f:
        f.write(header(len(toks), vocab, tokenizer, zlib.crc32(raw) if crc else None, width))
        f.write(raw)


def width_of(path):
    magic = struct.unpack("<i", open(path, "rb").read(4))[0]
    return next(w for w, (m, _, _) in FORMATS.items() if m == magic)


def slice_of(text, skip, n):
    out = bytearray()
    skip %= len(text)
    while len(out) < n:
        out += text[skip:skip + n - len(out)]
        skip = 0
    return out


M64 = (1 << 64) - 1


def mix64(z):
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def rng_u64(seed, stream, counter):
    return mix64(mix64(mix64(seed) ^ stream) ^ counter)


def fnv1a(s):
    h = 1469598103934665603
    for c in s.encode():
        h = ((h ^ c) * 1099511628211) & M64
    return h


def unpermute(y, n, key):
    """x with ds_permute(x, n, key) = y: the Feistel rounds backwards,
    cycle-walked back into [0, n)."""
    bits = 2
    while bits < 64 and (1 << bits) < n:
        bits += 2
    h = bits // 2
    mask = (1 << h) - 1
    x = y
    while True:
        l, r = x >> h, x & mask
        for rnd in range(5, -1, -1):
            l, r = r ^ (rng_u64(key, rnd, l) & mask), l
        x = l << h | r
        if x < n:
            return x


def opts(args):
    o = {"skip": 0, "vocab": 256, "tokenizer": 1, "crc": True, "width": 2, "add": 0}
    rest = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--no-crc":
            o["crc"] = False
        elif a.startswith("--"):
            o[a[2:]] = int(args[i + 1])
            i += 1
        else:
            rest.append(a)
        i += 1
    return o, rest


def main(argv):
    cmd, (o, a) = argv[1], opts(argv[2:])
    if cmd == "text":
        toks = [t + o["add"] for t in slice_of(text_bytes(), o["skip"], int(a[1]))]
        write_tokens(a[0], toks, o["vocab"], o["tokenizer"], o["crc"], o["width"])
    elif cmd == "many":
        text, n = text_bytes(), int(a[2])
        for i in range(int(a[1])):
            write_tokens("%s%06d.bin" % (a[0], i), slice_of(text, i * 7919, n), o["vocab"],
                         o["tokenizer"], o["crc"])
    elif cmd == "sparse":
        n = int(a[1])
        with open(a[0], "wb") as f:
            f.write(header(n, o["vocab"], o["tokenizer"], width=o["width"]))
            f.truncate(HDR + o["width"] * n)
    elif cmd == "poke":
        width = width_of(a[0])
        with open(a[0], "r+b") as f:
            f.seek(HDR + width * int(a[1]))
            f.write(packed([int(t) for t in a[2:]], width))
    elif cmd == "slot":
        with open(a[0], "r+b") as f:
            f.seek(4 * int(a[1]))
            f.write(struct.pack("<i", int(a[2])))
    elif cmd == "sample":
        seed, n, seq = int(a[0]), int(a[1]), int(a[2])
        print(unpermute(seq, n, rng_u64(seed, fnv1a("data-order") ^ 0, 0)))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
