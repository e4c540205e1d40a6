"""elmo_tf.machine: the CPU's model and flags from /proc/cpuinfo, as pretraining and the benchmarks read them."""

import os
import platform

from elmo_tf import machine

CPUINFO = """processor\t: 0
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse2 avx2 fma avx512f avx512_bf16
processor\t: 1
model name\t: another
flags\t\t: fpu
"""


def test_the_first_processor_is_read(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    model, flags = machine.cpu_info(str(path))
    assert model == "AMD EPYC 9B14" and {"avx2", "avx512_bf16"} <= flags and "fpu" in flags
    assert machine.has_native_bfloat16(str(path))
    head = f"{os.cpu_count()}-core {platform.machine()}"
    assert machine.cpu_description(str(path)) == f"{head} (AMD EPYC 9B14; avx2, avx512f, avx512_bf16)"


def test_a_cpu_without_bfloat16_and_an_unreadable_file(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text("model name : Zen 3\nflags : avx2 fma amx_tile\n")
    assert not machine.has_native_bfloat16(str(path))
    assert machine.cpu_description(str(path)).endswith("(Zen 3; avx2, amx)")
    missing = str(tmp_path / "missing")
    assert machine.cpu_info(missing) == (None, None)
    assert machine.has_native_bfloat16(missing)  # no evidence: no warning
    assert machine.cpu_description(missing).endswith("(model unrecorded)")
