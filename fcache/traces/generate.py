#!/usr/bin/env python3
"""Writes the ra-diff trace set (fcache/traces/*.trace). Run from anywhere; deterministic
(random traces use fixed seeds), so running it again reproduces the checked-in files. After
changing a trace, record the kernel again (see README.md): the recorded-set test refuses a
recording whose operations differ from the traces."""

import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
KiB, MiB = 1 << 10, 1 << 20
P = 4096


def write(name, size, about, lines):
    with open(os.path.join(HERE, name + ".trace"), "w") as out:
        out.write(f"# {name}: {about}\n# written by generate.py\n")
        out.write(f"file-size {size}\n")
        for line in lines:
            out.write(line + "\n")


def read(offset, length):
    return f"read {offset} {length}"


def seq(start, length, count):
    return [read(start + k * length, length) for k in range(count)]


# Sequential, several request sizes and start offsets.
write("seq-4k-from-0", 16 * MiB, "4 KiB reads from the start", seq(0, 4 * KiB, 40))
write("seq-4k-from-1m", 16 * MiB, "4 KiB reads from 1 MiB (no start-of-file boost)",
      seq(1 * MiB, 4 * KiB, 40))
write("seq-4k-unaligned", 16 * MiB, "4 KiB reads at byte 100 of a page, from 5 MiB",
      seq(5 * MiB + 100, 4 * KiB, 40))
write("seq-1000b", 16 * MiB, "1000-byte reads from the start (several per page)",
      seq(0, 1000, 40))
write("seq-16k-from-0", 16 * MiB, "16 KiB reads from the start", seq(0, 16 * KiB, 40))
write("seq-64k-from-0", 16 * MiB, "64 KiB reads from the start", seq(0, 64 * KiB, 32))
write("seq-128k-from-3m", 16 * MiB, "128 KiB reads from 3 MiB + 12 KiB",
      seq(3 * MiB + 12 * KiB, 128 * KiB, 30))
write("seq-1m-from-0", 64 * MiB, "1 MiB reads from the start", seq(0, 1 * MiB, 24))
write("seq-1m-from-12k", 64 * MiB, "1 MiB reads from 12 KiB", seq(12 * KiB, 1 * MiB, 16))
write("seq-8m-reads", 64 * MiB, "8 MiB reads from the start (larger than a 128 KiB window)",
      seq(0, 8 * MiB, 5))

# Strided.
for stride, length, count, size in [(2 * P, P, 30, 16 * MiB), (4 * P, P, 30, 16 * MiB),
                                    (64 * KiB, 16 * KiB, 25, 16 * MiB),
                                    (1 * MiB, 64 * KiB, 16, 64 * MiB)]:
    name = f"stride-{stride // KiB}k-read-{length // KiB}k"
    write(name, size, f"{length // KiB} KiB reads every {stride // KiB} KiB",
          [read(k * stride, length) for k in range(count)])

# Interleaved streams on one descriptor.
def interleave(bases, length, count):
    return [read(base + k * length, length) for k in range(count) for base in bases]

write("interleave-2x4k", 16 * MiB, "two 4 KiB streams, at 0 and 8 MiB, alternating",
      interleave([0, 8 * MiB], 4 * KiB, 20))
write("interleave-3x16k", 16 * MiB, "three 16 KiB streams, at 0, 4 MiB and 10 MiB",
      interleave([0, 4 * MiB, 10 * MiB], 16 * KiB, 15))
write("interleave-2x64k", 64 * MiB, "two 64 KiB streams, at 1 MiB and 32 MiB",
      interleave([1 * MiB, 32 * MiB], 64 * KiB, 15))
write("interleave-4x4k", 16 * MiB, "four 4 KiB streams, 2 MiB apart",
      interleave([0, 2 * MiB, 4 * MiB, 6 * MiB], 4 * KiB, 10))

# Backward.
write("backward-4k", 16 * MiB, "4 KiB reads walking back from page 2000",
      [read((2000 - k) * P, P) for k in range(30)])
write("backward-64k", 16 * MiB, "64 KiB reads walking back from 8 MiB",
      [read(8 * MiB - (k + 1) * 64 * KiB, 64 * KiB) for k in range(20)])

# Random, seeded.
rng = random.Random(19)
write("random-4k", 64 * MiB, "4 KiB reads at random pages (seed 19)",
      [read(rng.randrange(0, 64 * MiB // P) * P, P) for _ in range(30)])
rng = random.Random(20)
write("random-sizes", 64 * MiB, "reads of 1 byte to 256 KiB at random offsets (seed 20)",
      [read(rng.randrange(0, 64 * MiB - 256 * KiB), rng.randrange(1, 256 * KiB))
       for _ in range(30)])

# A jump in the middle of a stream.
write("jump-forward", 16 * MiB, "4 KiB reads from 0, then from 6 MiB",
      seq(0, 4 * KiB, 20) + seq(6 * MiB, 4 * KiB, 20))
write("jump-back", 16 * MiB, "64 KiB reads from 0, back to 128 KiB, on past the first",
      seq(0, 64 * KiB, 12) + seq(128 * KiB, 64 * KiB, 20))

# The tail of a file whose last page is partial.
size = 1 * MiB + 1234
write("tail-partial", size, "16 KiB reads over the end of a file of 1 MiB + 1234 bytes",
      seq(1 * MiB - 96 * KiB, 16 * KiB, 9))
size = 300 * KiB + 777
write("tail-big-read", size, "a 64 KiB read, then one across the end, then past it",
      [read(0, 64 * KiB), read(64 * KiB, 512 * KiB), read(size, 4 * KiB),
       read(size - 10, 100)])

# Mixed small and large requests.
sizes = [4 * KiB, 128 * KiB, 1 * KiB, 512 * KiB, 8 * KiB, 2 * MiB, 100, 64 * KiB]
lines, pos = [], 0
for k in range(24):
    length = sizes[k % len(sizes)]
    lines.append(read(pos, length))
    pos += length
write("mixed-sizes", 64 * MiB, "sequential reads of mixed sizes, 100 bytes to 2 MiB", lines)

# Advice in the middle.
write("willneed-mid", 16 * MiB, "4 KiB reads, WILLNEED of 2 MiB at 4 MiB, reads there",
      seq(0, 4 * KiB, 10) + ["willneed 4194304 2097152"] + seq(4 * MiB, 4 * KiB, 12)
      + ["willneed 12582912 0"] + seq(12 * MiB + 8 * KiB, 4 * KiB, 4))
write("dontneed-mid", 16 * MiB, "16 KiB reads, DONTNEED behind them, re-reads",
      seq(0, 16 * KiB, 15) + ["dontneed 0 65536", "dontneed 70000 20000"]
      + seq(240 * KiB, 16 * KiB, 10) + [read(0, 4 * KiB), read(4 * KiB, 4 * KiB)]
      + ["dontneed 0 0"] + seq(64 * KiB, 16 * KiB, 6))

# Files smaller than one window.
write("small-file-40k", 40 * KiB, "4 KiB reads over a 40 KiB file, on past its end",
      seq(0, 4 * KiB, 12))
write("small-file-6000b", 6000, "reads of a 6000-byte file", seq(0, 1000, 7)
      + [read(0, 100000)])

# Re-reading cached ranges.
write("reread-cached", 16 * MiB, "4 KiB reads, again from 0, then on from where they were",
      seq(0, 4 * KiB, 16) + seq(0, 4 * KiB, 16) + seq(64 * KiB, 4 * KiB, 12))
write("reread-window", 16 * MiB, "64 KiB reads from 2 MiB, a re-read behind, then on",
      seq(2 * MiB, 64 * KiB, 10) + [read(2 * MiB + 128 * KiB, 64 * KiB)]
      + seq(2 * MiB + 640 * KiB, 64 * KiB, 10))

# Large folios met in the middle: a second stream, a history walk and advice inside them.
write("large-folio-interleave", 64 * MiB,
      "256 KiB reads ramp a stream into large folios; a 4 KiB stream in between",
      [l for k in range(24) for l in (read(k * 256 * KiB, 256 * KiB),
                                       read(40 * MiB + k * 4 * KiB, 4 * KiB))])
write("large-folio-history", 64 * MiB,
      "1 MiB reads from 0, then reads a few pages past, each a jump",
      seq(0, 1 * MiB, 10) + [read(10 * MiB + 3 * P, P), read(10 * MiB + 40 * P, P),
                             read(24 * MiB + 5 * P, 8 * P), read(24 * MiB + 20 * P, P)])
write("large-folio-dontneed", 64 * MiB,
      "1 MiB reads, DONTNEED of ranges cutting through large folios, reads again",
      seq(0, 1 * MiB, 6) + ["dontneed 100000 1000000", "dontneed 2097152 65536",
                            "dontneed 3000000 0"] + seq(0, 64 * KiB, 8) + seq(2 * MiB, 4 * KiB, 8))
write("eof-then-back", 300 * KiB + 777,
      "4 KiB reads to the end of a small file, then back into it",
      seq(0, 4 * KiB, 80) + [read(100 * KiB, 4 * KiB), read(8 * KiB, 64 * KiB)])
write("willneed-overlap", 16 * MiB, "WILLNEED over cached and uncached ranges, then reads",
      seq(0, 4 * KiB, 6) + ["willneed 0 262144", "willneed 4194304 0", "willneed 8392000 10"]
      + seq(256 * KiB, 4 * KiB, 8) + seq(8 * MiB, 4 * KiB, 6))
write("page-edge-reads", 16 * MiB, "reads of one page that start on a page's last byte",
      [read(k * P + 4095, P) for k in range(30)])
