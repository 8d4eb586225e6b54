"""The data pipeline on real tiny inputs: readers, masking, truncation, packing, MindRecord."""
import itertools
import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llama_npu.data.batches import BatchStream, ListSamples
from llama_npu.data.chat_template import render_text
from llama_npu.data.mindrecord import MindRecordSamples
from llama_npu.data.packing import pack
from llama_npu.data.readers import RecordError, read_records
from llama_npu.data.samples import tokenize_records
from llama_npu.data.tokenizer import default_tokenizer_path, load_tokenizer
from llama_npu.model.tokens import IGNORE_ID

from conftest import REPO, SMOKE, TINY_RUN, read_metrics, run_cli


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("llama3.2")


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def reference_ids(messages):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(default_tokenizer_path())).encode(render_text(messages),
                                                                    add_special_tokens=False).ids


GOOD = {"instruction": "把这句话翻译成英文", "input": "今天天气很好。", "output": "The weather is nice today."}


@pytest.mark.quick
def test_prepare_data_writes_mindrecord_and_a_complete_report(tmp_path):
    src = write_jsonl(tmp_path / "a.jsonl", [GOOD] * 3 + [{"instruction": "只有问题"}, GOOD])
    out = tmp_path / "prepared"
    proc = run_cli("prepare-data", "--format", "alpaca", "--input", src, "--output", out, "--max-seq-len", "64",
                   "--on-bad-record", "skip", check=True)
    meta = json.loads((out / "meta.json").read_text())
    c = meta["counts"]
    assert (c["read"], c["written"], c["skipped"], c["dropped"]) == (5, 4, 1, 0)
    assert c["read"] == c["written"] + c["skipped"] + c["dropped"]
    assert meta["skipped_by_reason"] == {"missing 'output'": {"count": 1, "first": [f"{src}:4"]}}
    assert meta["tokenizer"]["name"] == "llama3.2" and len(meta["sources"][0]["sha256"]) == 64
    assert {"p50", "p95", "max"} <= meta["token_lengths"].keys()
    assert "skipped 1 x missing 'output'" in proc.stdout
    assert "tokenizing 4 records" in proc.stdout and re.search(r"tokenize: .*4/4 \[\d\d:\d\d<", proc.stderr)
    assert sorted(p.name for p in out.iterdir()) == ["checksums.json", "data.mindrecord", "data.mindrecord.db",
                                                      "meta.json"]
    assert len(MindRecordSamples(out)) == 4


@pytest.mark.parametrize("content, message", [
    ('{"instruction": "a", "output": "b"}\n{"instruction": "a", "output": ""}\n',
     ":2: field 'output' is empty; expected a non-empty string"),
    ('{"instruction": "a", "output": "b"}\n{"instruction": "a", "output": "b"\n', ":2:35: malformed JSON"),
    ('{"instruction": 3, "output": "b"}\n', ":1: field 'instruction' must be a string, got int"),
    ("", "no records (empty input)"),
])
def test_first_bad_record_stops_with_file_and_line(tmp_path, content, message):
    src = tmp_path / "bad.jsonl"
    src.write_text(content, encoding="utf-8")
    out = tmp_path / "out"
    proc = run_cli("prepare-data", "--format", "alpaca", "--input", src, "--output", out)
    assert proc.returncode == 2
    assert message in proc.stderr and "bad.jsonl" in proc.stderr
    assert not out.exists() and not list(tmp_path.glob(".out*")), "no partial output may remain"


def test_gbk_is_named_with_a_hint_and_a_bom_is_accepted(tmp_path):
    gbk = tmp_path / "gbk.jsonl"
    gbk.write_bytes(json.dumps(GOOD, ensure_ascii=False).encode("gbk") + b"\n")
    with pytest.raises(RecordError, match="gbk.jsonl:1: not UTF-8.*iconv -f GBK"):
        read_records([gbk], "alpaca")
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps(GOOD, ensure_ascii=False).encode("utf-8") + b"\n")
    assert read_records([bom], "alpaca")[0].messages[-1] == ("assistant", GOOD["output"])


def test_existing_output_is_refused_and_kept(tmp_path):
    src = write_jsonl(tmp_path / "a.jsonl", [GOOD])
    out = tmp_path / "prepared"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    proc = run_cli("prepare-data", "--format", "alpaca", "--input", src, "--output", out)
    assert proc.returncode == 2 and "exists; pass --overwrite" in proc.stderr
    assert (out / "keep.txt").read_text() == "mine"


SHAREGPT = {"conversations": [
    {"from": "system", "value": "你是一位导游。"},
    {"from": "human", "value": "北京有什么好玩的？"},
    {"from": "gpt", "value": "可以去故宫和长城。"},
    {"from": "human", "value": "故宫要玩多久？"},
    {"from": "gpt", "value": "一般需要半天。"}]}


def test_sharegpt_multi_turn_token_for_token(tmp_path, tok):
    messages_variant = {"messages": [{"role": t["from"].replace("human", "user").replace("gpt", "assistant"),
                                      "content": t["value"]} for t in SHAREGPT["conversations"]]}
    records = read_records([write_jsonl(tmp_path / "s.jsonl", [SHAREGPT, messages_variant])], "sharegpt")
    assert records[0].messages == records[1].messages
    (sample, _), report = tokenize_records(tok, records, 512)
    assert sample.input_ids == reference_ids(records[0].messages)
    targets = [l for l in sample.labels if l != IGNORE_ID]
    answers = [tok.encode(a, add_special_tokens=False).ids + [128009] for a in ("可以去故宫和长城。", "一般需要半天。")]
    assert targets == answers[0] + answers[1]  # both assistant turns, nothing else
    assert report.read == 2 and report.kept == 2


@pytest.mark.parametrize("record, reason", [
    ({"conversations": [{"from": "human", "value": "hi"}, {"from": "bot", "value": "x"}]}, "unknown role 'bot'"),
    ({"conversations": [{"from": "human", "value": "hi"}]}, "expected it to end with the assistant"),
    ({"chat": []}, "expected a 'conversations' list"),
])
def test_sharegpt_errors(tmp_path, record, reason):
    with pytest.raises(RecordError, match=reason):
        read_records([write_jsonl(tmp_path / "s.jsonl", [record])], "sharegpt")


def test_text_format_trains_on_every_token(tmp_path, tok):
    records = read_records([write_jsonl(tmp_path / "t.jsonl", [{"text": "长江是中国最长的河流。"}])], "text")
    (sample, *_), _ = tokenize_records(tok, records, 512)
    body = tok.encode("长江是中国最长的河流。", add_special_tokens=False).ids
    assert sample.input_ids == [128000] + body + [128001]
    assert sample.labels == [IGNORE_ID] + body + [128001]


def test_keep_prompt_keeps_the_prompt_and_drops_answerless_samples(tok):
    long_answer = read_records([REPO / "data" / "zh_instruct_train.jsonl"], "alpaca")[:20]
    samples, report = tokenize_records(tok, long_answer, 48, truncation="keep_prompt")
    assert report.truncated > 0 and all(len(s.input_ids) == len(s.labels) <= 48 for s in samples)
    assert report.read == report.kept + report.dropped
    _, tiny = tokenize_records(tok, long_answer, 12, truncation="keep_prompt")  # not even the prompt fits
    assert tiny.dropped == 20 and tiny.kept == 0
    # keep_end cuts the prompt instead: every record keeps answer tokens
    kept, tiny = tokenize_records(tok, long_answer, 12)
    assert tiny.kept == 20 and all(any(t != IGNORE_ID for t in s.labels) for s in kept)


def test_packing_does_not_change_any_sample_loss(ms, tok):
    """Per-sample losses of a packed row equal those of the samples alone."""
    from llama_npu.data.samples import pad_batch
    from llama_npu.model.tokens import PAD_ID
    from llama_npu.recipe.load import load_recipe
    from llama_npu.strategies.network import build_network

    records = read_records([REPO / "data" / "zh_instruct_train.jsonl"], "alpaca")[:6]
    samples, _ = tokenize_records(tok, records, 40)
    ms.set_seed(0)
    _, cell = build_network(load_recipe(SMOKE, ["data.max_seq_len=127"]), on_ascend=False)
    rows = pack(samples, 128)
    assert len(rows) < len(samples) and max(max(r.segment_ids) for r in rows) > 1
    alone = sum(float(cell(*map(ms.Tensor, pad_batch([s], 128, PAD_ID))).asnumpy()) for s in samples)
    packed = sum(float(cell(*map(ms.Tensor, pad_batch([r], 128, PAD_ID))).asnumpy()) for r in rows)
    assert packed == pytest.approx(alone, rel=1e-5)
    # Without segment ids the samples would see each other and the loss would change.
    leaky = sum(float(cell(*map(ms.Tensor, pad_batch([r], 128, PAD_ID)[:2])).asnumpy()) for r in rows)
    assert abs(leaky - alone) > max(100 * abs(packed - alone), 1e-2)


def test_best_fit_packing_of_the_shipped_sample(tok):
    """Every sample exactly once, no row over the length, the same rows on every call, and
    little padding: under 5% at max_seq_len 512; at 256, where 162 of the 230 samples are
    longer than half a row (so no packer keeping samples whole needs fewer than 162 rows),
    at most one row above that floor, against 188 rows (29.8%) placed in arrival order."""
    records = read_records([REPO / "data" / "zh_instruct_train.jsonl"], "alpaca")
    for max_seq_len in (256, 512):
        length = max_seq_len + 1
        samples, _ = tokenize_records(tok, records, length)
        rows = pack(samples, length)
        assert rows == pack(samples, length)
        assert max(len(r.input_ids) for r in rows) <= length
        pieces = []
        for row in rows:
            ids, labels, segments = (np.asarray(x) for x in (row.input_ids, row.labels, row.segment_ids))
            pieces += [(tuple(ids[segments == s]), tuple(labels[segments == s])) for s in range(1, segments.max() + 1)]
        assert sorted(pieces) == sorted((tuple(s.input_ids), tuple(s.labels)) for s in samples)
        padding = 1 - sum(len(s.input_ids) for s in samples) / (len(rows) * length)
        if max_seq_len == 256:
            floor = sum(len(s.input_ids) > length / 2 for s in samples)
            assert floor == 162 and len(rows) <= floor + 1 and padding < 0.20
        else:
            assert padding < 0.05


@pytest.mark.parametrize("rows_a_file", [None, 500])
@pytest.mark.parametrize("packed", [False, True])
def test_prepared_rows_are_the_in_memory_samples(tmp_path, tok, packed, rows_a_file, monkeypatch):
    """prepare-data streams records through flat chunks, a spill file and its own MindRecord
    writer; what it stores is exactly what train's in-memory path builds from the same
    records (TOKENIZE_BATCH 1024 < 2,300 records: several chunks, and a sample cut to 97),
    in any order asked. Written as files of `rows_a_file` rows (a writer's index grows with
    its rows until commit), the files are read back as one dataset, in order."""
    from llama_npu.data import mindrecord
    from llama_npu.data.prepare import prepare_dataset

    if rows_a_file:
        monkeypatch.setattr(mindrecord, "ROWS_A_FILE", rows_a_file)
    src = tmp_path / "ten.jsonl"
    src.write_text((REPO / "data" / "zh_instruct_train.jsonl").read_text(encoding="utf-8") * 10, encoding="utf-8")
    meta = prepare_dataset("alpaca", [str(src)], tmp_path / "prepared", max_seq_len=96, packed=packed)
    samples, report = tokenize_records(tok, read_records([src], "alpaca"), 97)
    expected = pack(samples, 97) if packed else samples
    stored = MindRecordSamples(tmp_path / "prepared")
    assert meta["counts"]["rows"] == len(stored) == len(expected) and report.truncated == meta["counts"]["truncated"] > 0
    order = np.random.default_rng(0).permutation(len(stored))
    for got, want in zip(stored.iterate(order), (expected[i] for i in order)):
        assert (got.input_ids, got.labels) == (want.input_ids, want.labels)
        assert got.segment_ids == want.segment_ids  # None unpacked: one segment
    assert meta["files"] == ["data.mindrecord"] + [f"data.mindrecord.{k}" for k in range(1, len(meta["files"]))]
    assert (len(meta["files"]) == 1) == (rows_a_file is None)
    assert sorted(p.name for p in (tmp_path / "prepared").iterdir()) == sorted(
        [name for f in meta["files"] for name in (f, f + ".db")] + ["meta.json", "checksums.json"])


@pytest.mark.parametrize("packed", [False, True])
def test_worker_processes_write_the_same_rows_in_the_same_order(tmp_path, packed, monkeypatch):
    """--workers: each worker process starts reading at its range's mark (a JSONL line, a row
    of a table, a record part-way along a JSON array's one line), so the dataset, the counts
    and the skip report are those of one process, across files, bad records and blank lines.
    Ranges of 12 records, a part at least 25: 4 parts here."""
    from llama_npu.data import prepare_parts
    from llama_npu.data.prepare import prepare_dataset

    monkeypatch.setattr(prepare_parts, "MARK_EVERY", 12)
    monkeypatch.setattr(prepare_parts, "RECORDS_A_PART", 25)
    base = [json.loads(line) for line in (REPO / "data" / "zh_instruct_train.jsonl").read_text("utf-8").splitlines()]
    lines = [json.dumps(r, ensure_ascii=False) for r in base[:60]]
    lines[7], lines[30] = "{not json", json.dumps({"instruction": "没有回答"}, ensure_ascii=False)
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text("\n".join(lines[:20] + ["", "  "] + lines[20:]) + "\n", encoding="utf-8")
    array = tmp_path / "b.json"  # 40 records on one line
    array.write_text(json.dumps(base[60:100], ensure_ascii=False), encoding="utf-8")
    table = tmp_path / "c.csv"
    table.write_text("instruction,input,output\n" + "".join(
        f'"{r["instruction"]}","{r.get("input", "")}","{r["output"]}"\n'.replace("\n\"", "\"") for r in base[100:130]
        if '"' not in r["instruction"] + r.get("input", "") + r["output"]), encoding="utf-8")
    inputs = [str(jsonl), str(array), str(table)]
    metas, rows = {}, {}
    for workers in (1, 4):
        out = tmp_path / f"w{workers}"
        metas[workers] = prepare_dataset("alpaca", inputs, out, max_seq_len=200, packed=packed,
                                         on_bad_record="skip", workers=workers)
        stored = MindRecordSamples(out)
        rows[workers] = [(s.input_ids, s.labels, s.segment_ids) for s in stored.iterate(range(len(stored)))]
    one, four = metas[1], metas[4]
    assert one["files"] == ["data.mindrecord"]
    assert four["files"] == ["data.mindrecord", "data-1.mindrecord", "data-2.mindrecord", "data-3.mindrecord"]
    assert {k: v for k, v in one.items() if k != "files"} == {k: v for k, v in four.items() if k != "files"}
    assert one["counts"]["skipped"] == 2 and one["counts"]["written"] > 100
    assert rows[1] == rows[4] and len(rows[1]) == one["counts"]["rows"]
    assert not [p.name for p in (tmp_path / "w4").iterdir() if p.name.startswith(".spill")]


@settings(max_examples=150, deadline=None)
@given(layout=st.lists(st.tuples(st.sampled_from(["good", "bad", "blank", "no answer"]), st.integers(1, 3)),
                       min_size=1, max_size=40),
       array=st.booleans(), mark=st.integers(1, 5), workers=st.integers(1, 4))
def test_every_part_starts_exactly_at_its_first_record(layout, array, mark, workers):
    """What --workers rests on, read in this process: a part that starts at its mark (file,
    line, good records before it on the line) and takes its span reads exactly the records
    the counting pass numbered start:stop, whatever the bad lines, blank lines and records
    sharing a line (a JSON array's) in between."""
    import tempfile
    from pathlib import Path

    from llama_npu.data import prepare_parts
    from llama_npu.data.readers import SkipReport, good_records
    from llama_npu.data.tables import ReadOptions

    record = {"good": dict(GOOD), "no answer": {"instruction": "只有问题"}}
    with tempfile.TemporaryDirectory() as tmp:
        lines, n = [], 0
        for kind, repeat in layout:  # a line: `repeat` records, or a blank / malformed one
            if kind in ("blank", "bad"):
                lines.append("" if kind == "blank" else "{broken")
                continue
            items = [dict(record[kind], output=f"答{n + i}") if kind == "good" else record[kind]
                     for i in range(repeat)]
            n += repeat
            lines.append(",".join(json.dumps(r, ensure_ascii=False) for r in items) if array else
                         "\n".join(json.dumps(r, ensure_ascii=False) for r in items))
        if array:
            lines = ["[" + ",\n".join(line for line in lines if line.startswith("{\"")) + "]"]
        inputs = []  # two files, their answers told apart: a part may start in the second
        for name in ("a", "b"):
            path = Path(tmp) / (name + (".json" if array else ".jsonl"))
            path.write_text(("\n".join(lines) + "\n").replace("答", name), encoding="utf-8")
            inputs.append(str(path))
        old = prepare_parts.MARK_EVERY, prepare_parts.RECORDS_A_PART
        prepare_parts.MARK_EVERY, prepare_parts.RECORDS_A_PART = mark, 1
        try:
            skipped = SkipReport()
            try:
                count, marks = prepare_parts.count_records(inputs, "alpaca", "skip", skipped, ReadOptions(), None)
            except RecordError:  # no line that parses at all
                return
            every = [r.where + r.messages[-1][1] for r in good_records(inputs, "alpaca", "skip", SkipReport())]
            spans = prepare_parts.spans(count, marks, workers)
        finally:
            prepare_parts.MARK_EVERY, prepare_parts.RECORDS_A_PART = old
        assert count == len(every) and spans[0].start == 0 and spans[-1].stop == count
        assert all(a.stop == b.start for a, b in zip(spans, spans[1:]))
        for span in spans:
            read = itertools.islice(good_records(inputs[span.file:], "alpaca", "skip", SkipReport(),
                                                 first_line=span.line), span.skip, span.skip + span.stop - span.start)
            assert [r.where + r.messages[-1][1] for r in read] == every[span.start:span.stop]


def test_prepare_data_workers_from_the_command_line(tmp_path, tok):
    """Two worker processes spawned from `python -m llama_npu` (100,000 records, 50,000 a
    worker at least; the second starts at a mark, every 1,024th record): the rows on both
    sides of the parts' boundary and at the end are the records' own samples, in order."""
    base = (REPO / "data" / "zh_instruct_train.jsonl").read_text("utf-8").splitlines()
    src = tmp_path / "many.jsonl"
    src.write_text("".join(base[i % len(base)] + "\n" for i in range(100_000)), encoding="utf-8")
    out = tmp_path / "prepared"
    proc = run_cli("prepare-data", "--format", "alpaca", "--input", src, "--output", out, "--max-seq-len", "1024",
                   "--workers", "2", check=True)
    assert "in 2 worker processes" in proc.stdout
    stored = MindRecordSamples(out)
    assert len(stored) == 100_000 and stored.meta["files"] == ["data.mindrecord", "data-1.mindrecord"]
    own, _ = tokenize_records(tok, read_records([REPO / "data" / "zh_instruct_train.jsonl"], "alpaca"), 1025)
    rows = [*range(49 * 1024 - 10, 49 * 1024 + 10), 99_999]  # the second part starts at the 49th mark
    assert [s.input_ids for s in stored.iterate(rows)] == [own[i % len(base)].input_ids for i in rows]


def test_mindrecord_stream_resumes_at_the_same_sample(tmp_path):
    src = write_jsonl(tmp_path / "a.jsonl", [dict(GOOD, output=f"第{i}个回答。") for i in range(7)])
    out = tmp_path / "prepared"
    run_cli("prepare-data", "--format", "alpaca", "--input", src, "--output", out, "--max-seq-len", "63",
            check=True)
    source = MindRecordSamples(out)
    straight = BatchStream(source, 3, 64, seed=5)
    batches = [straight.next_batch() for _ in range(5)]  # crosses two epoch boundaries
    resumed = BatchStream(source, 3, 64, seed=5, samples_consumed=6)
    for expected in batches[2:]:
        got = resumed.next_batch()
        for a, b in zip(got, expected):
            np.testing.assert_array_equal(a, b)
    # the same order as the in-memory source of the same samples
    listed = BatchStream(ListSamples(list(source.iterate(range(len(source))))), 3, 64, seed=5)
    np.testing.assert_array_equal(listed.next_batch()[0], batches[0][0])


def test_train_from_prepared_packed_data(tmp_path):
    out = tmp_path / "prepared"
    proc = run_cli("prepare-data", "--format", "alpaca", "--input", REPO / "data" / "zh_instruct_train.jsonl",
                   "--output", out, "--max-seq-len", "96", "--pack", check=True)
    meta = json.loads((out / "meta.json").read_text())
    share = meta["padding_ratio"]
    assert share["packed"] < share["unpacked"]
    assert (f"stored at their own length: {meta['counts']['tokens']:,} tokens; training pads each row to 97 tokens, "
            f"{share['packed']:.1%} of its slots padding ({share['unpacked']:.1%} unpacked)") in proc.stdout
    run_dir = tmp_path / "run"
    run_cli("train", SMOKE, "--output-dir", run_dir, *TINY_RUN, "--set", "data.max_seq_len=96",
            "--set", "data.train_files=[]", "--set", f"data.prepared={out}", "--set", "train.max_steps=2",
            check=True)
    assert all(np.isfinite(r["loss"]) for r in read_metrics(run_dir))
    proc = run_cli("train", SMOKE, "--output-dir", tmp_path / "run2", *TINY_RUN, "--set", "data.train_files=[]",
                   "--set", f"data.prepared={out}")
    assert proc.returncode == 2 and "prepared with --max-seq-len 96, but data.max_seq_len=32" in proc.stderr
