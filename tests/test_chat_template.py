"""The Llama 3 chat format, token for token, and which tokens carry loss."""
import pytest

from llama_npu.data.chat_template import encode_chat, render_text
from llama_npu.data.readers import read_records
from llama_npu.data.tokenizer import load_tokenizer
from llama_npu.model.tokens import IGNORE_ID


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("llama3.2")


def _reference_ids(tok, messages):
    """The rendered string encoded in one go with special tokens recognised."""
    from tokenizers import Tokenizer

    from llama_npu.data.tokenizer import default_tokenizer_path

    plain = Tokenizer.from_file(str(default_tokenizer_path()))
    return plain.encode(render_text(messages), add_special_tokens=False).ids


MESSAGES = [("system", "你是一位耐心的数学老师。"), ("user", "三加五等于几？"), ("assistant", "三加五等于八。")]


def test_ids_equal_the_rendered_llama3_string(tok):
    ids, labels = encode_chat(tok, MESSAGES)
    assert ids == _reference_ids(tok, MESSAGES)
    assert ids[:5] == [128000, 128006, 9125, 128007, 271]  # <|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n
    assert ids[-1] == 128009 and len(ids) == len(labels)


def test_loss_only_on_the_answer_and_its_eot(tok):
    ids, labels = encode_chat(tok, MESSAGES)
    answer = tok.encode("三加五等于八。", add_special_tokens=False).ids + [128009]
    targets = [l for l in labels if l != IGNORE_ID]
    assert targets == answer
    assert labels[-len(answer):] == answer


def test_train_on_prompt_keeps_every_content_token(tok):
    _, masked = encode_chat(tok, MESSAGES)
    _, full = encode_chat(tok, MESSAGES, train_on_prompt=True)
    assert sum(l != IGNORE_ID for l in full) > sum(l != IGNORE_ID for l in masked)


def test_special_token_text_in_data_stays_text(tok):
    ids, _ = encode_chat(tok, [("user", "a<|eot_id|>b"), ("assistant", "ok")])
    assert ids.count(128009) == 2  # only the two real turn ends


def test_shipped_sample_has_200_distinct_pairs_and_a_held_out_split():
    from conftest import REPO

    train = read_records([REPO / "data" / "zh_instruct_train.jsonl"], "alpaca")
    held_out = read_records([REPO / "data" / "zh_instruct_eval.jsonl"], "alpaca")
    assert len(train) + len(held_out) >= 200 and len(held_out) >= 20
    prompts = [next(c for r, c in rec.messages if r == "user") for rec in train + held_out]
    assert len(set(prompts)) == len(prompts)


@pytest.mark.parametrize("train_on_prompt", [False, True])
def test_training_assembles_every_record_as_encode_chat_does(tok, train_on_prompt):
    """Training tokenizes records a chunk at a time with numpy (data/samples.py assemble_chunk);
    pairs, eval and generate take encode_chat's lists. Both must give the same ids and labels
    for every role, several turns and train_on_prompt, and text records their document form."""
    from llama_npu.data.readers import Record
    from llama_npu.data.samples import tokenize_records
    from llama_npu.data.samples import END_OF_TEXT_ID
    from llama_npu.model.tokens import BOS_ID

    conversations = [MESSAGES, MESSAGES[1:],
                     [("user", "第一问"), ("assistant", "第一答"), ("user", "第二问：为什么？"), ("assistant", "因为如此。"),
                      ("user", "第三问"), ("assistant", "好。")],
                     [("system", ""), ("user", "空的系统提示"), ("assistant", "")]]
    records = [Record(f"r:{i}", messages=m) for i, m in enumerate(conversations)] + [Record("t:1", text="一段连续的文本。")]
    samples, report = tokenize_records(tok, records, 10_000, train_on_prompt)
    assert report.kept == len(records) and report.truncated == 0
    for sample, messages in zip(samples, conversations):
        assert (list(sample.input_ids), list(sample.labels)) == encode_chat(tok, messages, train_on_prompt)
    text_ids = tok.encode("一段连续的文本。", add_special_tokens=False).ids
    assert list(samples[-1].input_ids) == [BOS_ID, *text_ids, END_OF_TEXT_ID]
    assert list(samples[-1].labels) == [IGNORE_ID, *text_ids, END_OF_TEXT_ID]
