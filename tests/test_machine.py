"""specwise.machine: the one reader of /proc/cpuinfo."""

import specwise.machine as machine

TWO_PROCESSORS = (
    "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
    "model name\t: Intel(R) Xeon(R) Platinum 8481C\nflags\t\t: fpu sse avx2 fma f16c avx512f avx512_vnni\n\n"
    "processor\t: 1\nvendor_id\t: OtherVendor\nmodel name\t: something else\nflags\t\t: fpu\n"
)


def fake(monkeypatch, text):
    monkeypatch.setattr(machine, "cpuinfo", lambda: machine.parse_cpuinfo(text))


def test_the_first_processor_block_is_read():
    fields = machine.parse_cpuinfo("\n" + TWO_PROCESSORS)
    assert fields["model name"] == "Intel(R) Xeon(R) Platinum 8481C"
    assert fields["vendor_id"] == "GenuineIntel" and fields["model"] == "143"


def test_facts_of_a_known_cpu(monkeypatch):
    fake(monkeypatch, TWO_PROCESSORS)
    assert machine.cpu_name() == "Intel(R) Xeon(R) Platinum 8481C"
    assert machine.cpu_generation() == "GenuineIntel family 6 model 143"
    assert machine.vector_flags() == ["avx2", "fma", "f16c", "avx512f", "avx512_vnni"]
    assert machine.has_flags("avx2", "fma", "f16c")
    assert not machine.has_flags("avx2", "avx512bw")


def test_nothing_known_gives_empty_facts(monkeypatch):
    fake(monkeypatch, "")
    assert machine.cpu_generation() is None
    assert machine.vector_flags() == [] and not machine.has_flags("avx2")
    assert isinstance(machine.cpu_name(), str)


def test_this_machine_is_read_once():
    machine.cpuinfo.cache_clear()
    first = machine.cpuinfo()
    assert machine.cpuinfo() is first
