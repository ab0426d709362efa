#!/usr/bin/env python3
"""Reads TensorBoard event files without TensorBoard, as an independent
check of what modtrain writes: each TFRecord's two masked CRC32Cs (the
crc32c module), each Event decoded by the protocol buffer library from a
descriptor of TensorFlow's event.proto and summary.proto built here (the
fields modtrain uses, under their real numbers).

    tb_events.py DIR                 print every event, one JSON line each
    tb_events.py DIR --check METRICS check the files against metrics.jsonl

--check replays the files in name order as TensorBoard does, a SessionLog
START at step s dropping what earlier files hold from step s on, and
requires: every file to begin with file_version "brain.Event:2" then a
START; every tag KIND/NAME[/...] to name a field of metrics.jsonl lines of
that kind; and the surviving scalars to equal metrics.jsonl's, read the
same way (a step line at or before the last one starts a launch, whose
lines replace what earlier ones wrote from that step on), for every scalar
field the files carry, with the same steps.
A file may end in a truncated record only when --allow-truncated names
it (a SIGKILLed launch); anything else is an error.
"""
import json
import os
import struct
import sys

import crc32c
from google.protobuf import descriptor_pb2, descriptor_pool

try:
    from google.protobuf.message_factory import GetMessageClass
except ImportError:  # protobuf < 4
    from google.protobuf import message_factory

    def GetMessageClass(desc):
        return message_factory.MessageFactory(desc.file.pool).GetPrototype(desc)


def build_event_class():
    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="tb_events_min.proto", package="tbmin",
                                             syntax="proto3")

    def message(name, fields, oneof=None):
        m = fdp.message_type.add(name=name)
        if oneof:
            m.oneof_decl.add(name=oneof)
        for fname, number, ftype, type_name, label, in_oneof in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = type_name
            if in_oneof:
                f.oneof_index = 0
        return m

    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    value = message("SummaryValue", [
        ("tag", 1, F.TYPE_STRING, None, opt, False),
        ("simple_value", 2, F.TYPE_FLOAT, None, opt, True),
    ], oneof="value")
    message("Summary", [("value", 1, F.TYPE_MESSAGE, ".tbmin.SummaryValue", rep, False)])
    sl = message("SessionLog", [
        ("status", 1, F.TYPE_ENUM, ".tbmin.SessionLog.SessionStatus", opt, False),
        ("checkpoint_path", 2, F.TYPE_STRING, None, opt, False),
        ("msg", 3, F.TYPE_STRING, None, opt, False),
    ])
    en = sl.enum_type.add(name="SessionStatus")
    for n, v in (("STATUS_UNSPECIFIED", 0), ("START", 1), ("STOP", 2), ("CHECKPOINT", 3)):
        en.value.add(name=n, number=v)
    message("Event", [
        ("wall_time", 1, F.TYPE_DOUBLE, None, opt, False),
        ("step", 2, F.TYPE_INT64, None, opt, False),
        ("file_version", 3, F.TYPE_STRING, None, opt, True),
        ("graph_def", 4, F.TYPE_BYTES, None, opt, True),
        ("summary", 5, F.TYPE_MESSAGE, ".tbmin.Summary", opt, True),
        ("session_log", 7, F.TYPE_MESSAGE, ".tbmin.SessionLog", opt, True),
    ], oneof="what")
    del value
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return GetMessageClass(pool.FindMessageTypeByName("tbmin.Event"))


Event = build_event_class()


def masked(data):
    c = crc32c.crc32c(data) & 0xFFFFFFFF
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class Bad(Exception):
    pass


def records(path, allow_truncated):
    """The Events of one file; raises Bad on any CRC or framing error."""
    data = open(path, "rb").read()
    at, out = 0, []
    while at < len(data):
        if len(data) - at < 12:
            if allow_truncated:
                break
            raise Bad("%s: %d stray bytes at offset %d" % (path, len(data) - at, at))
        head = data[at:at + 8]
        (n,) = struct.unpack("<Q", head)
        (hc,) = struct.unpack("<I", data[at + 8:at + 12])
        if hc != masked(head):
            raise Bad("%s: record at offset %d: the length's CRC is wrong" % (path, at))
        if at + 12 + n + 4 > len(data):
            if allow_truncated:
                break
            raise Bad("%s: record at offset %d runs past the end" % (path, at))
        body = data[at + 12:at + 12 + n]
        (bc,) = struct.unpack("<I", data[at + 12 + n:at + 16 + n])
        if bc != masked(body):
            raise Bad("%s: record at offset %d: the data's CRC is wrong" % (path, at))
        ev = Event()
        ev.ParseFromString(body)
        if ev.SerializeToString() != body:
            raise Bad("%s: record at offset %d holds fields outside event.proto's" % (path, at))
        out.append(ev)
        at += 16 + n
    return out


def event_files(d):
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.startswith("events.out.tfevents."))


def replay(d, truncated):
    """TensorBoard's view of the files: {tag: {step: value}}, and the files' count."""
    scalars, files = {}, event_files(d)
    if not files:
        raise Bad("%s: no events.out.tfevents.* file" % d)
    for path in files:
        evs = records(path, os.path.basename(path) in truncated)
        if len(evs) < 2 or evs[0].WhichOneof("what") != "file_version" or \
                evs[0].file_version != "brain.Event:2":
            raise Bad("%s: does not begin with file_version brain.Event:2" % path)
        if evs[1].WhichOneof("what") != "session_log" or evs[1].session_log.status != 1:
            raise Bad("%s: its second event is not a SessionLog START" % path)
        for ev in evs[1:]:
            kind = ev.WhichOneof("what")
            if kind == "session_log":
                if ev.session_log.status != 1 or ev is not evs[1]:
                    raise Bad("%s: a SessionLog other than the launch's START" % path)
                for tag in scalars:  # TensorBoard's purge of orphaned data
                    scalars[tag] = {s: v for s, v in scalars[tag].items() if s < ev.step}
            elif kind == "summary":
                for v in ev.summary.value:
                    if v.WhichOneof("value") != "simple_value":
                        raise Bad("%s: tag %s is not a simple_value" % (path, v.tag))
                    scalars.setdefault(v.tag, {})[ev.step] = v.simple_value
            else:
                raise Bad("%s: an event of kind %s" % (path, kind))
    return scalars, len(files)


KINDS = {"train": lambda r: "loss" in r, "val": lambda r: "val_loss" in r,
         "ckpt": lambda r: "ckpt_step" in r, "stall": lambda r: "ckpt_stall_ms" in r,
         "nonfinite": lambda r: "nonfinite" in r}


class Printed(float):
    """A number of metrics.jsonl with the rounding its printing allows."""
    tol = 0.0


def printed(text):
    x = Printed(text)
    mant, _, exp = text.lower().partition("e")
    dec = len(mant.partition(".")[2])
    x.tol = 0.5 * 10.0 ** (int(exp or 0) - dec)
    return x


def flatten(name, v, out, prefix):
    if isinstance(v, bool):
        return
    if isinstance(v, (int, float)):
        out[prefix + name] = v
    elif isinstance(v, list):
        for i, x in enumerate(v):
            flatten(str(i), x, out, prefix + name + "/")
    elif isinstance(v, dict):
        for k, x in v.items():
            if isinstance(x, list) and len(x) == 2 and not isinstance(x[0], list):
                out[prefix + name + "/" + k + "/min"] = x[0]
                out[prefix + name + "/" + k + "/max"] = x[1]
            else:
                flatten(k, x, out, prefix + name + "/")


def check(d, metrics, truncated):
    scalars, nfiles = replay(d, truncated)
    want = {}  # tag -> {step: value}
    names = {}  # kind -> the field names its lines carry
    last = 0
    for line in open(metrics):
        rec = json.loads(line, parse_float=printed)
        kind = next(k for k, is_kind in KINDS.items() if is_kind(rec))
        names.setdefault(kind, set()).update(rec)
        if kind == "train":
            if rec["step"] <= last:  # a new launch: what it trains again replaces the old
                for tag in want:
                    want[tag] = {s: v for s, v in want[tag].items() if s < rec["step"]}
            last = rec["step"]
        flat = {}
        for k, v in rec.items():
            if k != "step":
                flatten(k, v, flat, kind + "/")
        for tag, v in flat.items():
            want.setdefault(tag, {})[rec["step"]] = v
    problems = []
    for tag, got in sorted(scalars.items()):
        kind, field = tag.split("/")[:2]
        if field not in names.get(kind, ()):
            problems.append("tag %s names no field of metrics.jsonl's %s lines" % (tag, kind))
            continue
        exp = want.get(tag, {})
        # the metrics line's steps of this tag, from the first the files hold
        exp = {s: v for s, v in exp.items() if s >= min(got)}
        if sorted(got) != sorted(exp):
            problems.append("tag %s: steps %s, metrics.jsonl has %s" %
                            (tag, sorted(got)[:12], sorted(exp)[:12]))
            continue
        for s in got:
            a, b = got[s], exp[s]
            # the printing's rounding, then float32's (half an ulp: 2^-24 relative)
            if abs(a - b) > getattr(b, "tol", 0.0) * 1.001 + 6e-8 * abs(b) + 1e-30:
                problems.append("tag %s step %d: %r, metrics.jsonl %r" % (tag, s, a, b))
                break
    for p in problems:
        print("tb_events: " + p)
    tags = len(scalars)
    points = sum(len(v) for v in scalars.values())
    print("tb_events: %d file%s, %d tags, %d points%s" %
          (nfiles, "" if nfiles == 1 else "s", tags, points, "" if not problems else ", MISMATCH"))
    return 1 if problems else 0


def main():
    args = sys.argv[1:]
    truncated = set()
    while "--allow-truncated" in args:
        i = args.index("--allow-truncated")
        truncated.add(args[i + 1])
        del args[i:i + 2]
    try:
        if len(args) == 3 and args[1] == "--check":
            return check(args[0], args[2], truncated)
        if len(args) != 1:
            print(__doc__)
            return 2
        for path in event_files(args[0]):
            for ev in records(path, os.path.basename(path) in truncated):
                kind = ev.WhichOneof("what")
                out = {"file": os.path.basename(path), "step": ev.step, "what": kind}
                if kind == "summary":
                    out["values"] = {v.tag: v.simple_value for v in ev.summary.value}
                elif kind == "file_version":
                    out["file_version"] = ev.file_version
                elif kind == "session_log":
                    out["status"] = ev.session_log.status
                print(json.dumps(out))
    except Bad as e:
        print("tb_events: %s" % e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
