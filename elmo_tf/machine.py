"""The CPU this process runs on, read from /proc/cpuinfo (Linux): its model name and vector flags.

Pretraining asks whether the CPU multiplies bfloat16 natively (`has_native_bfloat16`); the benchmarks name the
machine of each run (`cpu_description`). Standard library only: no TensorFlow.
"""

import os
import platform

CPUINFO = "/proc/cpuinfo"
# the flags that change which kernels TensorFlow runs: oneDNN's bfloat16 needs avx512f; native bfloat16 is
# avx512_bf16 or AMX
VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile")


def cpu_info(cpuinfo=CPUINFO):
    """`(model name, flags)` of the first processor in `cpuinfo`: the model a string or None, the flags a set; None
    for both where the file cannot be read (not Linux)."""
    model, flags = None, None
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model is None:
                    model = value.strip()
                elif key == "flags" and flags is None:
                    flags = set(value.split())
    except OSError:
        return None, None
    return model, flags


def has_native_bfloat16(cpuinfo=CPUINFO):
    """Whether this CPU multiplies bfloat16 natively (x86 AVX512_BF16 or AMX); True where it cannot be told (no
    flags to read), so that no warning is given without evidence."""
    _model, flags = cpu_info(cpuinfo)
    return flags is None or bool({"avx512_bf16", "amx_bf16"} & flags)


def cpu_description(cpuinfo=CPUINFO):
    """This machine's CPU as the benchmark tables name it, e.g. "2-core x86_64 (AMD EPYC 9B14; avx2, avx512f,
    avx512_bf16)": the core count, the architecture, the model name and which of VECTOR_FLAGS it has (amx_tile shown
    as amx). "N-core ARCH (model unrecorded)" where `cpuinfo` cannot be read."""
    model, flags = cpu_info(cpuinfo)
    head = f"{os.cpu_count()}-core {platform.machine() or 'unknown'}"
    named = [("amx" if flag == "amx_tile" else flag) for flag in VECTOR_FLAGS if flag in (flags or ())]
    inside = "; ".join(x for x in (model or "model unrecorded", ", ".join(named)) if x)
    return f"{head} ({inside})"
