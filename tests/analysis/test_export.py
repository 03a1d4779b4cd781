import csv
import io
import json

from hookdbg.analysis.export import perfetto, table_rows, write_csv, write_json
from hookdbg.read import open_recording


def test_perfetto_trace_parses_and_nests(resnet_h5):
    with open_recording(resnet_h5) as rec:
        buffer = io.StringIO()
        count = perfetto(rec, buffer)
    trace = json.loads(buffer.getvalue())
    events = trace["traceEvents"]
    assert len(events) == count
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["cat"] for e in spans} == {"step", "fwd", "bwd", "opt"}
    assert sum(e["name"] == "model.layer1.0.conv1" for e in spans) == 4  # fwd+bwd, 2 steps
    for tid in {e["tid"] for e in spans}:  # on each track, spans nest properly
        stack: list[float] = []
        for e in sorted((e for e in spans if e["tid"] == tid), key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1] <= e["ts"] + 1e-3:  # ts + dur is float arithmetic
                stack.pop()
            end = e["ts"] + e["dur"]
            assert not stack or end <= stack[-1] + 1e-3, e
            stack.append(end)
    steps = [e for e in spans if e["cat"] == "step"]
    forward = [e for e in spans if e["cat"] == "fwd" and e["name"] == "model"]
    for step, root in zip(steps, forward, strict=True):
        assert step["ts"] <= root["ts"] and root["ts"] + root["dur"] <= step["ts"] + step["dur"]


def test_csv_and_json_tables(mlp_h5):
    with open_recording(mlp_h5) as rec:
        n = len(rec.tensors_table)
        text = io.StringIO()
        assert write_csv(table_rows(rec, "tensors"), text) == n
        rows = list(csv.DictReader(io.StringIO(text.getvalue())))
        assert len(rows) == n and rows[0]["module"] == "model" and rows[0]["slot"] == "input"
        assert rows[0]["shape"] == "(64, 8, 8)"
        text = io.StringIO()
        write_json(table_rows(rec, "modules"), text)
        modules = json.loads(text.getvalue())
        assert [m["name"] for m in modules][:2] == ["model", "model.body"]
        text = io.StringIO()
        write_json(table_rows(rec, "calls", 1, 1), text)
        assert {c["step"] for c in json.loads(text.getvalue())} == {1}
