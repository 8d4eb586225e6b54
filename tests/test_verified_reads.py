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


# ---------------------------------------------------------------- #59: every read covered, every sidecar bounded

def damaged_run(six_step_run, tmp_path, how, *args):
    """A copy of the shared run whose step_6 is damaged by step_damage.`how`(*args)."""
    import step_damage

    run = step_damage.copy_run(six_step_run[0], tmp_path / "run")
    getattr(step_damage, how)(run / "checkpoints" / "step_6", *args)
    return run, run / "checkpoints" / "step_6"


def limited_memory():
    """preexec_fn: a reader that reads a sidecar without bound fails at 4 GiB of address
    space (MemoryError) rather than taking the machine's memory."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def passed_over(proc, run, why):
    """A run directory given: exit 0, and one warning naming step_6 skipped and why."""
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count(f"{run}: using step_3, not the newest step: step_6 skipped (") == 1, proc.stderr[-3000:]
    assert why in proc.stderr, proc.stderr[-3000:]


def test_a_file_whose_entry_was_dropped_from_checksums_json_is_damage(six_step_run, tmp_path):
    """model.ckpt's entry dropped, the manifest resealed, a byte of model.ckpt flipped: main
    exported it with exit 0 ("read unverified")."""
    run, step = damaged_run(six_step_run, tmp_path, "unlisted_and_flipped", "model.ckpt")
    proc = run_cli("convert", "ms-to-hf", "--src", step, "--dst", tmp_path / "hf")
    one_error_line(proc, f"{step / 'model.ckpt'} is not listed in checksums.json")
    assert not (tmp_path / "hf").exists()
    proc = run_cli("convert", "ms-to-hf", "--src", run, "--dst", tmp_path / "hf")
    passed_over(proc, run, "model.ckpt is not listed in checksums.json")
    assert (tmp_path / "hf" / "model.safetensors").is_file()


def test_an_unlisted_damaged_optimizer_ckpt_is_refused_by_a_reader_of_the_weights(six_step_run, tmp_path):
    """The docs say a step is checked whole: eval reads no optimizer.ckpt, yet refuses the step."""
    _, step = damaged_run(six_step_run, tmp_path, "unlisted_and_flipped", "optimizer.ckpt")
    proc = run_cli("eval", "--checkpoint", step, "--data", REPO / "data" / "zh_instruct_eval.jsonl")
    one_error_line(proc, f"{step / 'optimizer.ckpt'} is not listed in checksums.json")


@pytest.mark.parametrize("name", ["model.ckpt", "optimizer.ckpt", "state.json", "config.json"])
def test_every_file_a_reader_reads_must_be_listed_even_intact(six_step_run, tmp_path, name):
    from llama_npu.checkpoints.files import CheckpointError, inspect, problem, verify_read
    import step_damage

    step = copy(six_step_run[0] / "checkpoints" / "step_6", tmp_path / "checkpoints" / "step_6")
    record = step_damage.manifest(step)
    del record["files"][name]
    step_damage.reseal(step, record)
    expected = f"{step / name} is not listed in checksums.json"
    assert problem(step).startswith(expected)
    assert inspect(step, verify=True)[1].startswith(expected)
    with pytest.raises(CheckpointError, match=expected):
        verify_read([step / "config.json", step / "model.ckpt"])


def test_state_json_linked_to_dev_zero_is_a_damaged_step(six_step_run, tmp_path):
    """main read it whole: its memory grew until a limit ended it (MemoryError, exit 1)."""
    run, step = damaged_run(six_step_run, tmp_path, "linked_to_dev_zero", "state.json")
    proc = run_cli("generate", "--checkpoint", step, "--prompt", "你好", "--max-new-tokens", "2",
                   preexec_fn=limited_memory)
    one_error_line(proc, f"{step} is not a complete checkpoint (sidecar state.json unreadable (not a regular file))")
    proc = run_cli("convert", "ms-to-hf", "--src", run, "--dst", tmp_path / "hf", preexec_fn=limited_memory)
    passed_over(proc, run, "step_6 skipped (sidecar state.json unreadable (not a regular file))")


@pytest.mark.parametrize("name, expected", [
    ("checksums.json", "is damaged or unreadable (not a regular file)"),
    ("config.json", "is not a regular file (checksums.json lists it)")])
def test_other_sidecars_linked_to_dev_zero_are_damage(six_step_run, tmp_path, name, expected):
    """A manifest that is not a regular file is damage, not a directory without one."""
    import step_damage
    from llama_npu.checkpoints.files import problem

    step = copy(six_step_run[0] / "checkpoints" / "step_6", tmp_path / "checkpoints" / "step_6")
    step_damage.linked_to_dev_zero(step, name)
    assert problem(step) == f"{step / name} {expected}"


@pytest.mark.parametrize("key, value, expected", [
    ("files.optimizer.ckpt", float("inf"), "'optimizer.ckpt': inf}, expected file name -> its byte count"),
    ("files.model.ckpt", -1, "expected file name -> its byte count"),
    ("files.model.ckpt", 1.5, "expected file name -> its byte count"),
    ("crc32.model.ckpt", float("nan"), "crc32 is {'model.ckpt': nan"),
    ("rng.seed", "0", "rng is {'seed': '0', 'data_epoch': 0}, expected {seed: a whole number"),
    ("rng.data_epoch", float("inf"), "rng is {'seed': 0, 'data_epoch': inf}"),
    ("rng", None, "rng is None"),
    ("samples_consumed", float("-inf"), "samples_consumed is -inf, expected a whole number"),
])
def test_every_number_of_a_sidecar_is_checked(six_step_run, tmp_path, key, value, expected):
    """Infinity in files: main's int(size) raised OverflowError in every reader."""
    import step_damage
    from llama_npu.checkpoints.files import inspect

    step = copy(six_step_run[0] / "checkpoints" / "step_6", tmp_path / "checkpoints" / "step_6")
    step_damage.sidecar_number(step, key, value)
    state, why = inspect(step, verify=True)
    assert state is None and why.startswith("sidecar state.json: ") and expected in why, why


def test_an_infinite_size_in_state_json_is_one_line_or_passed_over(six_step_run, tmp_path):
    run, step = damaged_run(six_step_run, tmp_path, "sidecar_number", "files.optimizer.ckpt", float("inf"))
    proc = run_cli("train", "--output-dir", run, "--resume", step)
    one_error_line(proc, f"--resume {step}: not a complete checkpoint directory (sidecar state.json: files is ")
    proc = run_cli("convert", "ms-to-hf", "--src", run, "--dst", tmp_path / "hf")
    passed_over(proc, run, "step_6 skipped (sidecar state.json: files is {")


def test_resume_auto_passes_over_a_step_with_an_infinite_size(six_step_run, tmp_path):
    run, step = damaged_run(six_step_run, tmp_path, "sidecar_number", "files.optimizer.ckpt", float("inf"))
    proc = run_cli("train", "--output-dir", run, "--resume", "auto")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"skipping checkpoint {step}: sidecar state.json: files is " in proc.stderr
    assert f"resumed from {run / 'checkpoints' / 'step_3'} at step 3" in proc.stdout


def test_a_step_missing_a_file_its_manifest_lists_is_refused_by_every_reader(six_step_run, tmp_path):
    """main resumed from it (exit 0) and ms-to-hf gave the merge-checkpoints hint."""
    run, step = damaged_run(six_step_run, tmp_path, "listed_and_missing", "config.json")
    missing = f"{step / 'config.json'} is missing (checksums.json lists it)"
    proc = run_cli("train", "--output-dir", run, "--resume", step)
    one_error_line(proc, f"--resume {step}: not a complete checkpoint directory ({missing})")
    proc = run_cli("convert", "ms-to-hf", "--src", step, "--dst", tmp_path / "hf")
    assert "merge-checkpoints" not in one_error_line(proc, missing)
    proc = run_cli("convert", "ms-to-hf", "--src", run, "--dst", tmp_path / "hf")
    passed_over(proc, run, f"step_6 skipped ({missing})")


def test_checksums_that_disagree_are_damage(six_step_run, tmp_path):
    """model.ckpt flipped and checksums.json resealed over it: state.json's CRC-32 still
    records the save; with both rewritten, MindSpore's own trailer does."""
    import step_damage
    from llama_npu.checkpoints.files import inspect
    from llama_npu.common.checksums import file_crc32

    step = copy(six_step_run[0] / "checkpoints" / "step_6", tmp_path / "checkpoints" / "step_6")
    step_damage.flip(step / "model.ckpt")
    record = step_damage.manifest(step)
    record["files"]["model.ckpt"]["crc32"] = file_crc32(step / "model.ckpt")
    step_damage.reseal(step, record)
    assert inspect(step)[1] == (f"{step / 'model.ckpt'}: checksums.json and state.json record different checksums "
                                f"for it (one of them was rewritten since the save)")
    step_damage.sidecar_number(step, "crc32.model.ckpt", file_crc32(step / "model.ckpt"))
    assert inspect(step)[1] is None  # every record agrees: only reading the bytes can tell
    assert inspect(step, verify=True)[1] == (f"{step / 'model.ckpt'} is damaged or unreadable (its CRC-32 differs "
                                             f"from the one its MindSpore trailer recorded)")
