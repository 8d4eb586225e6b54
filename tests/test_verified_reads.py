"""Every command verifies what it reads (#41): a flipped byte in any file a command reads of a
checkpoint step, a converted or a quantized directory is one line naming the file and what to
do, exit 2; a run directory's damaged newest step is passed over by name; sizes read from a
file are bounded before anything is allocated from them. The many cases drive the
verification in-process; the real command line runs once per command."""
import json
import shutil
import struct

import pytest

from conftest import REPO, run_cli

pytestmark = pytest.mark.usefixtures("ms")

DPO = REPO / "recipes" / "cpu_dpo_smoke.yaml"


def flip(path, at=None):
    """One byte changed, the size kept: only a checksum notices."""
    data = bytearray(path.read_bytes())
    at = len(data) // 2 if at is None else at
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def one_error_line(proc, *needles):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert lines[-1].startswith("llama-npu: error: "), lines[-3:]
    assert not any("Traceback" in line for line in lines), proc.stderr[-3000:]
    for needle in needles:
        assert str(needle) in lines[-1], lines[-1]
    return lines[-1]


@pytest.fixture(scope="module")
def quantized(conversions, tmp_path_factory):
    """The float32 conversion quantized by `llama-npu quantize`'s own function."""
    from llama_npu.weights.quantize import quantize_checkpoint

    out = tmp_path_factory.mktemp("quantized") / "int8"
    quantize_checkpoint(conversions["float32"], out)
    return out


def files_of(directory):
    return sorted(p.name for p in directory.iterdir() if p.is_file())


def test_every_directory_written_has_a_manifest_of_every_file(conversions, quantized, six_step_run):
    from llama_npu.common.checksums import read_manifest

    step = six_step_run[0] / "checkpoints" / "step_6"
    for directory, expected in ((conversions["float32"], ["config.json", "model.ckpt"]),
                                (quantized, ["config.json", "model.ckpt"]),
                                (step, ["config.json", "model.ckpt", "optimizer.ckpt", "state.json"])):
        manifest, damaged = read_manifest(directory)
        assert damaged is None
        assert sorted(manifest["files"]) == expected
        assert files_of(directory) == sorted([*expected, "checksums.json"])


@pytest.mark.parametrize("kind", ["converted", "quantized", "step"])
def test_a_flipped_byte_in_any_file_of_a_directory_read_is_named_with_what_to_do(kind, conversions, quantized, six_step_run,
                                                                   tmp_path):
    from llama_npu.checkpoints.files import CheckpointError, verify_read

    source = {"converted": conversions["float32"], "quantized": quantized,
              "step": six_step_run[0] / "checkpoints" / "step_6"}[kind]
    remedy = {"converted": "write it again: llama-npu convert hf-to-ms --src",
              "quantized": "write it again: llama-npu quantize --checkpoint",
              "step": "use an older step, such as "}[kind]
    for name in files_of(source):
        at = {"config.json": 5, "state.json": 5, "checksums.json": 40}.get(name)  # inside the JSON, not its whitespace
        # each case in its own run-like layout, so a step keeps its older sibling
        directory = tmp_path / name / "checkpoints" / source.name
        if kind == "step":
            shutil.copytree(source.parent / "step_3", directory.parent / "step_3")
        copy(source, directory)
        verify_read([directory / f for f in files_of(directory)])  # sound before
        flip(directory / name, at)
        with pytest.raises(CheckpointError) as caught:  # eval reads these two; the directory is checked whole
            verify_read([directory / "config.json", directory / "model.ckpt"])
        message = str(caught.value)
        named = directory / (name if name != "checksums.json" else "checksums.json")
        assert message.startswith(f"{named} ") and "damaged" in message, message
        if name != "checksums.json":
            assert remedy in message, message
        if kind == "step":
            assert str(directory.parent / "step_3") in message


def test_an_older_directory_without_a_manifest_is_read_with_a_warning(conversions, tmp_path, capsys):
    """Converted before checksums.json: the weights are still checked by MindSpore's own CRC
    trailer, config.json is read unverified and a warning says so."""
    from llama_npu.checkpoints.files import CheckpointError, verify_read

    old = copy(conversions["float32"], tmp_path / "old")
    (old / "checksums.json").unlink()
    verify_read([old / "config.json", old / "model.ckpt"])
    assert f"{old}: config.json read unverified" in capsys.readouterr().err
    flip(old / "model.ckpt")
    with pytest.raises(CheckpointError, match="its CRC-32 differs from the one its MindSpore trailer recorded"):
        verify_read([old / "config.json", old / "model.ckpt"])


def test_an_older_step_is_checked_by_its_state_json(six_step_run, tmp_path):
    from llama_npu.checkpoints.files import CheckpointError, verify_read

    step = copy(six_step_run[0] / "checkpoints" / "step_6", tmp_path / "checkpoints" / "step_6")
    (step / "checksums.json").unlink()
    flip(step / "model.ckpt")
    with pytest.raises(CheckpointError, match="the one state.json recorded"):
        verify_read([step / "model.ckpt"])


def test_a_truncated_newest_step_is_passed_over_by_name(six_step_run, tmp_path, capsys):
    """eval --checkpoint RUN takes the newest sound step and says which step it skipped and why."""
    from llama_npu.checkpoints.files import CheckpointError
    from llama_npu.weights.pretrained import resolve_weights

    run = copy(six_step_run[0], tmp_path / "run")
    newest = run / "checkpoints" / "step_6" / "model.ckpt"
    with open(newest, "r+b") as fh:
        fh.truncate(newest.stat().st_size // 2)
    assert resolve_weights(run).weights == run / "checkpoints" / "step_3" / "model.ckpt"
    err = capsys.readouterr().err
    assert f"{run}: using step_3, not the newest step: step_6 skipped (model.ckpt has" in err
    # given by name, the damaged step is refused, pointing at the older one
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        resolve_weights(run / "checkpoints" / "step_6")
    flip(run / "checkpoints" / "step_3" / "model.ckpt")
    with pytest.raises(CheckpointError, match=r"no complete checkpoint .*step_6: model.ckpt has .*step_3: \S+model"
                                              r".ckpt is damaged"):
        resolve_weights(run)


def hf_copy(hf_dir, tmp_path, **config_changes):
    src = copy(hf_dir[0], tmp_path / "hf")
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps(dict(config, **config_changes)))
    return src


@pytest.mark.parametrize("key, value, expected", [
    ("num_hidden_layers", 2 ** 40, "num_hidden_layers=1099511627776; expected a whole number from 1 to 28"),
    ("hidden_size", -64, "hidden_size=-64; expected a whole number from 1 to 3072"),
    ("intermediate_size", "128", "intermediate_size='128'; expected a whole number"),
    ("num_key_value_heads", 3, "the heads must divide the hidden size and the KV heads the heads")])
def test_absurd_sizes_in_config_json_are_refused_before_allocating(hf_dir, tmp_path, key, value, expected):
    from llama_npu.weights.convert import ConvertError, checked_hf_model

    src = hf_copy(hf_dir, tmp_path, **{key: value})
    with pytest.raises(ConvertError, match=expected):
        checked_hf_model(src)


def test_a_converted_description_with_absurd_sizes_is_refused(conversions, tmp_path):
    from llama_npu.weights.convert import ConvertError
    from llama_npu.weights.pretrained import read_checkpoint_dir

    meta = json.loads((conversions["float32"] / "config.json").read_text())
    meta["shape"]["num_layers"] = 2 ** 40
    (tmp_path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ConvertError, match=r"shape.num_layers=1099511627776; expected a whole number from 1 to 28"):
        read_checkpoint_dir(tmp_path)


def test_a_safetensors_header_lying_about_sizes_is_refused(hf_dir, tmp_path):
    from llama_npu.weights.tensor_files import ConvertError, safetensors_index

    path = hf_dir[0] / "model.safetensors"
    (length,) = struct.unpack("<Q", path.read_bytes()[:8])
    header = json.loads(path.read_bytes()[8:8 + length])
    body = path.read_bytes()[8 + length:]

    def written(changed):
        encoded = json.dumps(changed).encode()
        out = tmp_path / "model.safetensors"
        out.write_bytes(struct.pack("<Q", len(encoded)) + encoded + body)
        return out

    name = "model.norm.weight"
    grown = dict(header, **{name: dict(header[name], shape=[2 ** 40])})
    with pytest.raises(ConvertError, match=f"tensor {name} .*should hold 4,398,046,511,104 bytes, the file holds 256"):
        safetensors_index(written(grown))
    huge = tmp_path / "huge.safetensors"
    huge.write_bytes(struct.pack("<Q", 2 ** 62) + b"{}")
    with pytest.raises(ConvertError, match="its header claims 4,611,686,018,427,387,904 bytes of a 10-byte file"):
        safetensors_index(huge)


def test_hf_to_ms_with_2_to_the_40_layers_is_one_line(hf_dir, tmp_path):
    src = hf_copy(hf_dir, tmp_path, num_hidden_layers=2 ** 40)
    proc = run_cli("convert", "hf-to-ms", "--src", src, "--dst", tmp_path / "out")
    one_error_line(proc, src / "config.json", "num_hidden_layers=1099511627776")
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- the real command line, once per command

def test_eval_of_a_flipped_conversion_exits_2_naming_the_file(conversions, tmp_path):
    bad = copy(conversions["float32"], tmp_path / "conv")
    flip(bad / "model.ckpt")
    proc = run_cli("eval", "--checkpoint", bad, "--data", REPO / "data" / "zh_instruct_eval.jsonl")
    one_error_line(proc, bad / "model.ckpt", "write it again: llama-npu convert hf-to-ms")


def test_generate_on_a_flipped_quantized_directory_exits_2(quantized, tmp_path):
    bad = copy(quantized, tmp_path / "int8")
    flip(bad / "config.json", 5)
    proc = run_cli("generate", "--checkpoint", bad, "--prompt", "你好", "--max-new-tokens", "2")
    one_error_line(proc, bad / "config.json", "write it again: llama-npu quantize")
    assert proc.stdout.strip() == ""


def test_ms_to_hf_of_a_step_with_a_flipped_state_json_exits_2(six_step_run, tmp_path):
    run = copy(six_step_run[0], tmp_path / "run")
    step = run / "checkpoints" / "step_6"
    flip(step / "state.json", 5)
    proc = run_cli("convert", "ms-to-hf", "--src", step, "--dst", tmp_path / "hf")
    one_error_line(proc, step / "state.json", f"use an older step, such as {run / 'checkpoints' / 'step_3'}")
    assert not (tmp_path / "hf").exists()


def test_quantize_of_a_flipped_step_exits_2_and_writes_nothing(six_step_run, tmp_path):
    run = copy(six_step_run[0], tmp_path / "run")
    step = run / "checkpoints" / "step_6"
    flip(step / "model.ckpt")
    proc = run_cli("quantize", "--checkpoint", step, "--dst", tmp_path / "int8")
    one_error_line(proc, step / "model.ckpt")
    assert not (tmp_path / "int8").exists()


def test_a_dpo_run_from_a_flipped_step_exits_2_before_training(six_step_run, tmp_path):
    run = copy(six_step_run[0], tmp_path / "sft")
    step = run / "checkpoints" / "step_6"
    flip(step / "config.json", 5)
    proc = run_cli("train", DPO, "--output-dir", tmp_path / "dpo", "--set", f"model.checkpoint={step}",
                   "--set", "train.max_steps=1")
    one_error_line(proc, step / "config.json")
    assert not (tmp_path / "dpo" / "checkpoints").exists()


def test_eval_of_a_run_with_a_truncated_newest_step_says_which_step_it_scored(six_step_run, tmp_path):
    run = copy(six_step_run[0], tmp_path / "run")
    newest = run / "checkpoints" / "step_6" / "model.ckpt"
    with open(newest, "r+b") as fh:
        fh.truncate(100)
    proc = run_cli("eval", "--checkpoint", run, "--data", REPO / "data" / "zh_instruct_eval.jsonl",
                   "--max-seq-len", "32", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("using step_3, not the newest step: step_6 skipped (model.ckpt has 100 bytes") == 1
    assert json.loads(proc.stdout.strip().splitlines()[-1])["loss"] > 0
