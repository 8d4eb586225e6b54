"""What `llama-npu doctor` checks of an Ascend host, with what a 910A and a 910B need, in
the reader's language (LANG / LC_ALL / LC_MESSAGES starting with zh: Chinese).

Followed: MindSpore 2.9.0's own check, mindspore/run_check/_check_version.py
(AscendEnvChecker: the CANN version is the `Version=` line of $ASCEND_HOME_PATH/compiler/
version.info, its first two fields one of AscendEnvChecker.version); the driver's
version.info is the file docker/README.md mounts; the overflow modes are FACTS.md's reading of
mindspore/nn/wrap/loss_scale.py. None of this has run on an NPU here: no CI host has one.
"""
from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Dict, List

# mindspore/run_check/_check_version.py, AscendEnvChecker.__init__ (MindSpore 2.9.0)
CANN_FOR_MINDSPORE = ("8.2", "8.3", "8.5", "9.0")
DRIVER_VERSION_FILE = Path("/usr/local/Ascend/driver/version.info")

TEXT: Dict[str, Dict[str, str]] = {
    "en": {
        "davinci": "device files   {count} /dev/davinciN (one per card the host or container shows; 8-card "
                   "recipes need 8)",
        "cann": "CANN           {version} (MindSpore 2.9.0 expects one of {expected}; read from {path})",
        "no_cann": "CANN           not found: ASCEND_HOME_PATH is not set (source CANN's set_env.sh); "
                   "MindSpore 2.9.0 expects one of {expected}",
        "mismatch": "DOES NOT MATCH: install a CANN MindSpore 2.9.0 supports (docs/ascend.md, section \"Supported versions\": the versions, the driver and the images by chip)",
        "driver": "NPU driver     {version} ({path}); it must be the driver version the CANN release names",
        "no_driver": "NPU driver     not found ({path})",
        "overflow": "overflow mode  MS_ASCEND_CHECK_OVERFLOW_MODE={mode}",
        "checks": "on a 910A/910B doctor checks: /dev/davinci* count, the CANN version MindSpore 2.9 accepts, the "
                  "driver version beside it, npu-smi info (chips, HBM, health) and the overflow mode:",
        "910a": "  910A: 32 GB HBM a card (about 29 GB usable), FP16 only, no flash attention; overflow is read "
                "from the float-status registers (saturation mode, its only mode); CANN image chip field 910",
        "910b": "  910B: 64 GB HBM (910B4: 32 GB), BF16, flash attention; overflow by AllFinite (INFNAN mode, "
                "the default) or the registers with SATURATION_MODE; CANN image chip field 910b",
        "next": "next           llama-npu selftest --json selftest.json proves each Ascend-only path on this "
                "device in minutes; attach its JSON to a bug report (docs/ascend.md; 中文: docs/ascend.zh-CN.md)",
    },
    "zh": {
        "davinci": "device files   {count} 个 /dev/davinciN（主机或容器可见的每张卡一个；8 卡配方需要 8 个）",
        "cann": "CANN           {version}（MindSpore 2.9.0 需要 {expected} 之一；读自 {path}）",
        "no_cann": "CANN           未找到：没有设置 ASCEND_HOME_PATH（请 source CANN 的 set_env.sh）；"
                   "MindSpore 2.9.0 需要 {expected} 之一",
        "mismatch": "不匹配：请安装 MindSpore 2.9.0 支持的 CANN（见 docs/ascend.zh-CN.md 的“支持的版本”一节：版本、驱动以及各芯片的镜像）",
        "driver": "NPU driver     {version}（{path}）；它必须是该 CANN 版本说明中指定的驱动版本",
        "no_driver": "NPU driver     未找到（{path}）",
        "overflow": "overflow mode  MS_ASCEND_CHECK_OVERFLOW_MODE={mode}",
        "checks": "在 910A/910B 上 doctor 检查：/dev/davinci* 的数量、MindSpore 2.9 接受的 CANN 版本、与之配套的驱动"
                  "版本、npu-smi info（芯片、HBM、健康状态）以及溢出检测模式：",
        "910a": "  910A：每卡 32 GB HBM（约 29 GB 可用），仅 FP16，没有 flash attention；溢出从浮点状态寄存器读取"
                "（饱和模式，它唯一的模式）；CANN 镜像的芯片字段为 910",
        "910b": "  910B：64 GB HBM（910B4 为 32 GB），支持 BF16 和 flash attention；溢出由 AllFinite 检测（默认的 "
                "INFNAN 模式），设置 SATURATION_MODE 时用寄存器；CANN 镜像的芯片字段为 910b",
        "next": "next           llama-npu selftest --json selftest.json 几分钟内在本设备上验证每条昇腾专用路径；"
                "报告问题时请附上它的 JSON（docs/ascend.zh-CN.md）",
    },
}


def reader_language() -> str:
    """zh when the locale the reader set is Chinese (LC_ALL over LC_MESSAGES over LANG, as gettext reads them)."""
    for name in ("LC_ALL", "LC_MESSAGES", "LANG"):
        value = os.environ.get(name, "")
        if value:
            return "zh" if value.lower().startswith("zh") else "en"
    return "en"


def version_line(path: Path) -> str:
    """The `Version=` value of a CANN or driver version.info, or ""."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return next((line.split("=", 1)[1].strip() for line in lines if line.startswith("Version=")), "")


def ascend_host_lines(lang: str) -> List[str]:
    """What this host has of what a 910A/910B run needs, then what each chip needs."""
    text, expected = TEXT[lang], ", ".join(CANN_FOR_MINDSPORE)
    lines = [text["checks"], text["910a"], text["910b"],
             text["davinci"].format(count=len(glob.glob("/dev/davinci[0-9]*")))]
    home = os.environ.get("ASCEND_HOME_PATH")
    cann_file = Path(home or ".") / "compiler" / "version.info"
    cann = version_line(cann_file) if home else ""
    lines.append(text["cann"].format(version=cann or "?", expected=expected, path=cann_file) if home
                 else text["no_cann"].format(expected=expected))
    if cann and ".".join(cann.split(".")[:2]) not in CANN_FOR_MINDSPORE:  # as AscendEnvChecker compares it
        lines[-1] += " " + text["mismatch"]
    driver = version_line(DRIVER_VERSION_FILE)
    lines.append(text["driver"].format(version=driver, path=DRIVER_VERSION_FILE) if driver
                 else text["no_driver"].format(path=DRIVER_VERSION_FILE))
    lines.append(text["overflow"].format(mode=os.environ.get("MS_ASCEND_CHECK_OVERFLOW_MODE", "(unset)")))
    return lines
