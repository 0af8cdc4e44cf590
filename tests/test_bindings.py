"""The native library's one interface: specwise/models/kernels/specwise.h, and its ctypes bindings checked against it.

The header is parsed here (its prototypes and ``typedef struct``s, with quant.h's). Every signature of
``kernels/abi.py`` and every function bound on the loaded library is checked against the prototypes (argument
count, each C type mapped to its ctypes type, the return type; a pointer to a struct must be a typed pointer to
that struct's Structure, a pointer to data may be ``c_void_p``); every function the built library exports is
declared there, and every declared one is bound. Every ctypes ``Structure`` of the package is checked against its C
struct: field names, order, each C type mapped to its ctypes type (a struct held by value by its name), and the size
and offset of every field as the C compiler lays it out on x86-64 and other LP64 machines. A header edited as a
signature change would edit it must fail these checks (tested on the real header's text).
"""

import ctypes
import importlib
import re
import struct
from pathlib import Path

import pytest

import specwise
from specwise.models import kernels

PACKAGE = Path(specwise.__file__).parent
HEADER = PACKAGE / "models" / "kernels" / "specwise.h"
TYPES = HEADER.parent / "quant.h"

# C scalar types of the header and the ctypes type each must be bound as (ctypes' aliases are the same objects:
# c_int64 is c_long on LP64 Linux, so an int64_t bound as c_long passes, one bound as c_int does not).
SCALARS = {
    "void": None,
    "int": ctypes.c_int,
    "float": ctypes.c_float,
    "double": ctypes.c_double,
    "size_t": ctypes.c_size_t,
    "int64_t": ctypes.c_int64,
    "int32_t": ctypes.c_int32,
    "uint32_t": ctypes.c_uint32,
    "uint16_t": ctypes.c_uint16,
    "uint8_t": ctypes.c_uint8,
}


# ------------------------------------------------------------------------------------------- the header's side

PROTOTYPE = re.compile(r"^\s*(?P<ret>[\w\s\*]+?)\s*\b(?P<name>specwise_\w+)\s*\((?P<args>[^()]*)\)\s*$", re.S)


def c_type(decl: str) -> tuple[str, int]:
    """(base type, pointer depth) of a declaration such as ``const float *const *attn_norm`` or ``int64_t``."""
    stars = decl.count("*")
    words = [w for w in re.split(r"[\s\*]+", decl) if w and w != "const"]
    if not words:
        raise ValueError(f"no type in {decl!r}")
    # the last word is the parameter's name when a type word comes before it
    base = words[0] if len(words) == 1 else " ".join(words[:-1])
    return base, stars


def strip_c(text: str) -> str:
    """C source without its comments and preprocessor lines."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def parse_header(text: str) -> dict[str, tuple[tuple[str, int], list[tuple[str, int]]]]:
    """``{name: (return type, [argument types])}`` of every ``specwise_*`` prototype in a C header."""
    text = strip_c(text)
    found = {}
    for chunk in text.split(";"):
        m = PROTOTYPE.match(chunk)
        if not m:
            continue
        name, args = m["name"], m["args"].strip()
        if name in found:
            raise ValueError(f"{name} is declared twice")
        params = [] if args in ("", "void") else [c_type(a) for a in args.split(",")]
        ret = c_type(m["ret"])
        found[name] = (ret, params)
    return found


def accepts(ctype, c: tuple[str, int]) -> bool:
    """Whether ``ctype`` (an argtypes entry or a restype) is a right binding of the C type ``c``."""
    base, stars = c
    if stars == 0 and isinstance(ctype, type) and issubclass(ctype, ctypes.Structure):
        return ctype.__name__.lower() == base  # a struct held by value: QPack for qpack
    if stars == 0:
        if base not in SCALARS:
            raise ValueError(f"the test does not know the C type {base!r}: add it to SCALARS")
        return ctype is SCALARS[base]
    if ctype is ctypes.c_void_p:
        # a data pointer may be passed as an address (a numpy array's); a pointer to a struct must be typed
        return stars > 1 or base in SCALARS
    pointee = getattr(ctype, "_type_", None)
    if not (isinstance(pointee, type) and issubclass(ctype, ctypes._Pointer)):
        return False
    if stars > 1:
        return accepts(pointee, (base, stars - 1))
    if isinstance(pointee, type) and issubclass(pointee, ctypes.Structure):
        return pointee.__name__.lower() == base  # QMat for qmat
    return base in SCALARS and pointee is SCALARS[base]


STRUCT = re.compile(r"typedef\s+struct\s*\w*\s*\{(?P<body>[^{}]*)\}\s*(?P<name>\w+)\s*;", re.S)


def parse_structs(text: str) -> dict[str, list[tuple[str, tuple[str, int]]]]:
    """``{name: [(field, (base type, pointer depth)), ...]}`` of every ``typedef struct {...} name;`` in a C header,
    fields in order; a declaration of several (``void *s, *m;``) gives each its own entry."""
    found = {}
    for m in STRUCT.finditer(strip_c(text)):
        fields = []
        for decl in m["body"].split(";"):
            if not decl.strip():
                continue
            first, *others = decl.split(",")
            base, stars = c_type(first)
            fields.append((re.split(r"[\s\*]+", first.strip())[-1], (base, stars)))
            for other in others:  # the base type is the first declarator's; each has its own stars
                name = other.replace("*", " ").replace("const", " ").strip()
                if not re.fullmatch(r"\w+", name):
                    raise ValueError(f"cannot read the field {other!r} of {m['name']}")
                fields.append((name, (base, other.count("*"))))
        if m["name"] in found:
            raise ValueError(f"struct {m['name']} is defined twice")
        found[m["name"]] = fields
    return found


def struct_mismatches(cls, fields: list[tuple[str, tuple[str, int]]]) -> list[str]:
    """What is wrong with the ctypes Structure ``cls`` as a binding of the C struct with ``fields`` (empty when
    right). A C field named like a Python keyword (``in``) is bound with a trailing underscore (``in_``)."""
    ours = list(cls._fields_)
    name = cls.__name__
    if len(ours) != len(fields):
        return [f"{name}: {len(ours)} fields, the C struct has {len(fields)}"]
    wrong = []
    for i, ((field, ctype, *bits), (c_field, c)) in enumerate(zip(ours, fields)):
        if bits:
            wrong.append(f"{name}.{field}: a bit field, the C struct has none")
        if field not in (c_field, c_field + "_"):
            wrong.append(f"{name}: field {i} is {field!r}, the C struct's is {c_field!r}")
        elif not accepts(ctype, c):
            shown = f"{c[0]}{' ' + '*' * c[1] if c[1] else ''}"
            wrong.append(f"{name}.{field} is {getattr(ctype, '__name__', ctype)}, the C struct's {c_field} is {shown}")
    return wrong


# sizes of the header's scalar types on x86-64 and the other LP64 targets the library is built for (each type's
# alignment is its size)
SIZES = {
    "int": 4,
    "float": 4,
    "double": 8,
    "size_t": 8,
    "int64_t": 8,
    "int32_t": 4,
    "uint32_t": 4,
    "uint16_t": 2,
    "uint8_t": 1,
}


def c_layout(name: str, structs: dict) -> tuple[int, int, list[int]]:
    """(size, alignment, [offset of each field]) of the C struct ``name`` as the compiler lays it out: each field at
    the next multiple of its alignment, the size rounded up to the struct's alignment."""
    offsets, at, align = [], 0, 1
    for _, (base, stars) in structs[name]:
        if stars:
            size = field_align = 8
        elif base in structs:
            size, field_align, _ = c_layout(base, structs)
        elif base in SIZES:
            size = field_align = SIZES[base]
        else:
            raise ValueError(f"the test does not know the size of {base!r}: add it to SIZES")
        at = -(-at // field_align) * field_align
        offsets.append(at)
        at += size
        align = max(align, field_align)
    return -(-at // align) * align, align, offsets


def layout_mismatches(cls, structs: dict) -> list[str]:
    """Where the ctypes Structure ``cls`` puts its fields, or its size, apart from the C struct of its name."""
    size, _, offsets = c_layout(cls.__name__.lower(), structs)
    wrong = []
    if ctypes.sizeof(cls) != size:
        wrong.append(f"{cls.__name__}: {ctypes.sizeof(cls)} bytes, the C struct {size}")
    for (field, *_), offset in zip(cls._fields_, offsets):
        if getattr(cls, field).offset != offset:
            wrong.append(f"{cls.__name__}.{field} at byte {getattr(cls, field).offset}, the C struct's at {offset}")
    return wrong


def package_structures() -> dict[str, type]:
    """Every ``class X(ctypes.Structure)`` defined in the package, by class name (found in the source text, so a
    module that is never imported is not missed)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        names = re.findall(r"^class (\w+)\(ctypes\.Structure\)", path.read_text(encoding="utf-8"), flags=re.M)
        if not names:
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = importlib.import_module(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
        for name in names:
            if name in found:
                raise ValueError(f"two ctypes Structures are named {name}")
            found[name] = getattr(module, name)
    return found


def mismatches(name: str, fn, declared) -> list[str]:
    """What is wrong with the binding ``fn`` of the declared function ``name`` (empty when it is right)."""
    ret, params = declared
    if fn.argtypes is None:
        return [f"{name}: not bound (no argtypes set)"]
    args = list(fn.argtypes)
    if len(args) != len(params):
        return [f"{name}: {len(args)} argtypes, the header declares {len(params)} arguments"]
    wrong = [
        f"{name}: argument {i} is {getattr(a, '__name__', a)}, the header says {c[0]}{' ' + '*' * c[1] if c[1] else ''}"
        for i, (a, c) in enumerate(zip(args, params))
        if not accepts(a, c)
    ]
    if not accepts(fn.restype, ret):
        wrong.append(f"{name}: restype {getattr(fn.restype, '__name__', fn.restype)}, the header returns {ret[0]}")
    return wrong


# ---------------------------------------------------------------------------------------- the library's side


def exported_functions(path: Path) -> set[str]:
    """The functions a 64-bit little-endian ELF shared library exports (its dynamic symbol table)."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        pytest.skip(f"{path.name} is not a 64-bit little-endian ELF file")
    shoff, shentsize, shnum = struct.unpack_from("<Q", data, 0x28)[0], *struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = set()
    for _, sh_type, _, _, offset, size, link, _, _, entsize in sections:
        if sh_type != 11:  # SHT_DYNSYM
            continue
        str_offset = sections[link][4]
        for at in range(offset, offset + size, entsize):
            st_name, st_info, st_other, st_shndx = struct.unpack_from("<IBBH", data, at)
            kind, bind = st_info & 0xF, st_info >> 4
            if st_shndx and kind in (2, 10) and bind in (1, 2) and (st_other & 3) == 0:  # FUNC / IFUNC, exported
                end = data.index(b"\0", str_offset + st_name)
                names.add(data[str_offset + st_name : end].decode())
    return names


@pytest.fixture(scope="module")
def declared():
    return parse_header(HEADER.read_text())


@pytest.fixture(scope="module")
def lib():
    library = kernels.native_library()
    if library is None:
        pytest.skip(f"the native library is not built: {kernels.kernel_error()}")
    from specwise.drafters import suffix

    suffix._native()  # the suffix functions are bound on first use
    return library


# -------------------------------------------------------------------------------------------------------- tests


def test_the_parser_reads_prototypes_and_the_checker_finds_wrong_bindings():
    header = """
    /* a comment naming specwise_nothing(int); */
    #include "quant.h"
    int64_t specwise_a(const float *const *x, int64_t n, const qmat *w);
    void specwise_b(void);
    """
    found = parse_header(header)
    assert found == {
        "specwise_a": (("int64_t", 0), [("float", 2), ("int64_t", 0), ("qmat", 1)]),
        "specwise_b": (("void", 0), []),
    }

    class QMat(ctypes.Structure):
        _fields_ = [("x", ctypes.c_int)]

    def fn(argtypes, restype):
        f = ctypes.CFUNCTYPE(None)()  # any foreign function object carries argtypes and restype
        f.argtypes, f.restype = argtypes, restype
        return f

    p, i64 = ctypes.c_void_p, ctypes.c_int64
    assert not mismatches("specwise_a", fn([p, i64, ctypes.POINTER(QMat)], i64), found["specwise_a"])
    assert not mismatches("specwise_a", fn([ctypes.POINTER(ctypes.POINTER(ctypes.c_float)), i64, ctypes.POINTER(QMat)],
                                           i64), found["specwise_a"])  # fmt: skip
    assert mismatches("specwise_a", fn([p, i64, p], i64), found["specwise_a"])  # a struct pointer as void *

    class QPack(ctypes.Structure):
        _fields_ = [("x", ctypes.c_int)]

    assert mismatches("specwise_a", fn([p, i64, ctypes.POINTER(QPack)], i64), found["specwise_a"])  # another struct
    assert mismatches("specwise_a", fn([p, ctypes.c_int, p], i64), found["specwise_a"])  # int64_t bound as int
    qm = ctypes.POINTER(QMat)
    assert mismatches("specwise_a", fn([p, i64], i64), found["specwise_a"])  # an argument missing
    assert mismatches("specwise_a", fn([p, i64, qm], ctypes.c_int), found["specwise_a"])  # wrong return type
    assert mismatches("specwise_a", fn([i64, i64, qm], i64), found["specwise_a"])  # a pointer bound as an integer
    assert mismatches("specwise_b", fn([], ctypes.c_int), found["specwise_b"])  # void bound as int
    with pytest.raises(ValueError, match="declared twice"):
        parse_header("int specwise_c(int a);\nint specwise_c(int a);")


def test_the_struct_parser_reads_fields_and_the_checker_finds_wrong_ones():
    header = """
    typedef struct {
        int kind;          /* a comment; with a semicolon */
        int64_t out, in;
        const float *const *norm;
        void *s, *m;
        float scale;
    } thing;
    """
    found = parse_structs(header)
    fields = [("kind", ("int", 0)), ("out", ("int64_t", 0)), ("in", ("int64_t", 0)), ("norm", ("float", 2)),
              ("s", ("void", 1)), ("m", ("void", 1)), ("scale", ("float", 0))]  # fmt: skip
    assert found == {"thing": fields}

    def structure(*fields_):
        return type("Thing", (ctypes.Structure,), {"_fields_": list(fields_)})

    i, i64, p, f = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
    right = [("kind", i), ("out", i64), ("in_", i64), ("norm", p), ("s", p), ("m", p), ("scale", f)]
    assert not struct_mismatches(structure(*right), fields)
    assert struct_mismatches(structure(*right[:-1]), fields)  # a field missing
    assert struct_mismatches(structure(*right[:2], ("in_", i), *right[3:]), fields)  # int64_t bound as int
    assert struct_mismatches(structure(right[1], right[0], *right[2:]), fields)  # two fields swapped
    assert struct_mismatches(structure(*right[:-1], ("scale", ctypes.c_double)), fields)  # float bound as double
    assert struct_mismatches(structure(*right[:-1], ("scales", f)), fields)  # a field misnamed
    # the compiler's layout: kind at 0, out at 8 (aligned), ..., scale at 48, 56 bytes in all (rounded up to 8)
    assert c_layout("thing", found) == (56, 8, [0, 8, 16, 24, 32, 40, 48])
    assert not layout_mismatches(structure(*right), found)
    packed = type("Thing", (ctypes.Structure,), {"_fields_": right, "_pack_": 4})
    assert layout_mismatches(packed, found)  # out at 4: another layout with the same types
    assert struct_mismatches(structure(*right[:3], ("norm", i64), *right[4:]), fields)  # a pointer as an integer
    with pytest.raises(ValueError, match="defined twice"):
        parse_structs("typedef struct { int a; } x;\ntypedef struct { int b; } x;")


def test_every_structure_matches_its_c_struct():
    structs = parse_structs(TYPES.read_text()) | parse_structs(HEADER.read_text())
    ours = package_structures()
    layer_structs = {"QShape", "QLayers", "QRows", "QWork", "QRun", "QModel", "QPass", "QHead", "QStep", "QLogits"}
    layer_structs |= {"SfxIndex", "SfxDraft", "SfxOut"}  # the suffix draft's (specwise_suffix_draft)
    assert {"QMat", "QPack", "QJob", "QArch"} | layer_structs <= set(ours)  # the scan finds them
    unbound = sorted(set(structs) - {name.lower() for name in ours})
    assert not unbound, f"C structs with no ctypes Structure in the package: {unbound}"
    unknown = sorted(name for name in ours if name.lower() not in structs)
    assert not unknown, (
        f"ctypes Structures with no typedef struct of their (lower-case) name in {TYPES.name} or {HEADER.name}: "
        f"{unknown}"
    )
    wrong = [problem for name, cls in ours.items() for problem in struct_mismatches(cls, structs[name.lower()])]
    assert not wrong, "\n".join(wrong)
    wrong = [problem for cls in ours.values() for problem in layout_mismatches(cls, structs)]
    assert not wrong, "\n".join(wrong)


def test_every_binding_matches_the_header(lib, declared):
    wrong = [
        problem
        for name, decl in declared.items()
        if hasattr(lib, name)
        for problem in mismatches(name, getattr(lib, name), decl)
    ]
    assert not wrong, "\n".join(wrong)


def test_the_library_exports_exactly_the_declared_functions(lib, declared):
    path = Path(lib._name)
    exported = exported_functions(path) - {name for name in exported_functions(path) if name.startswith("PyInit_")}
    undeclared = sorted(exported - set(declared))
    assert not undeclared, f"exported but not declared in {HEADER.name}: {undeclared}"
    missing = sorted(set(declared) - exported)  # every kernel is built on every platform (a portable path each)
    assert not missing, f"declared in {HEADER.name} but not exported by {path.name}: {missing}"


def test_every_function_the_package_calls_is_declared(declared):
    """Names used on the library object (``lib.specwise_x``) or looked up by name (``_native("specwise_x")``)."""
    used = set()
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        used |= {(m, path.name) for m in re.findall(r"\.(specwise_[a-z0-9_]+)\b", text)}
        used |= {(m, path.name) for m in re.findall(r"_native\(\s*\"(specwise_[a-z0-9_]+)\"", text)}
    unknown = sorted(f"{name} ({where})" for name, where in used if name not in declared)
    assert not unknown, f"used but not declared in {HEADER.name}: {unknown}"
    assert {name for name, _ in used} >= {"specwise_q_gemm", "specwise_suffix_draft"}  # the scan finds calls


def test_every_source_file_includes_the_header():
    sources = sorted(HEADER.parent.glob("*.c"))
    assert sources
    missing = [s.name for s in sources if s.name != "module.c" and '#include "specwise.h"' not in s.read_text()]
    assert not missing, f"these kernels do not include specwise.h, so nothing checks their definitions: {missing}"


def abi_mismatches(header: str, types: str) -> list[str]:
    """What is wrong with kernels/abi.py's signatures and Structures against a header's text (and quant.h's)."""
    from specwise.models.kernels import abi

    declared_ = parse_header(header)
    structs = parse_structs(types) | parse_structs(header)
    wrong = []
    for name, (args, res) in abi.SIGNATURES.items():
        if name not in declared_:
            wrong.append(f"{name}: bound in abi.py, not declared in the header")
            continue
        fn = ctypes.CFUNCTYPE(None)()  # a foreign function object, to carry the signature
        fn.argtypes, fn.restype = args, res
        wrong += mismatches(name, fn, declared_[name])
    for name in abi.__all__:
        cls = getattr(abi, name)
        if isinstance(cls, type) and issubclass(cls, ctypes.Structure):
            if cls.__name__.lower() not in structs:
                wrong.append(f"{cls.__name__}: no struct {cls.__name__.lower()} in the header")
                continue
            wrong += struct_mismatches(cls, structs[cls.__name__.lower()]) or layout_mismatches(cls, structs)
    return wrong


def test_the_signatures_and_structures_match_the_header_without_the_library(declared):
    """kernels/abi.py against the header: also where the library is not built (a core install without a compiler)."""
    from specwise.models.kernels import abi

    assert not abi_mismatches(HEADER.read_text(), TYPES.read_text())
    unbound = sorted(set(declared) - set(abi.SIGNATURES) - {n for n in declared if n.startswith("specwise_suffix_")})
    assert not unbound, f"declared in {HEADER.name} with no signature in abi.py: {unbound}"


# each: an edit of the real header as a change of the C side would make it, and the binding it must be found in
CHANGES = [
    ("an argument's type", r"(specwise_q_gemm\(const qmat \*parts, )int( nparts)", r"\1int64_t\2", "specwise_q_gemm"),
    ("an argument removed", r"(specwise_q_row\(const qmat \*w, )int64_t row, ", r"\1", "specwise_q_row"),
    (
        "a struct pointer's struct",
        r"(specwise_qllama_scratch_floats\(const )qshape",
        r"\1qrows",
        "specwise_qllama_scratch_floats",
    ),
    ("the return type", r"\bdouble (specwise_q_abs_sum)", r"float \1", "specwise_q_abs_sum"),
    ("a field added", r"(float eps;[^\n]*\n)(\} qshape;)", r"\1    int64_t extra;\n\2", "QShape"),
    ("a field's type", r"int32_t (kv_half;)", r"int64_t \1", "QRows"),
    ("two fields swapped", r"(float \*scratch;[^\n]*\n)(\s*int64_t scratch_floats;)", r"\2\n\1", "QWork"),
    ("a struct field's struct", r"const qmat (\*fc;)", r"const qarch \1", "QHead"),
]


@pytest.mark.parametrize("what, pattern, replacement, where", CHANGES, ids=[c[0] for c in CHANGES])
def test_a_changed_header_fails_the_check(what, pattern, replacement, where):
    header = HEADER.read_text()
    changed, count = re.subn(pattern, replacement, header)
    assert count == 1, f"the pattern for {what} no longer matches {HEADER.name} once: update the test's edit"
    wrong = abi_mismatches(changed, TYPES.read_text())
    assert wrong, f"{what} went unnoticed"
    assert all(problem.startswith(where) for problem in wrong), wrong


def test_the_library_is_bound_with_abi_signatures(lib):
    from specwise.models.kernels import abi

    for name, (args, res) in abi.SIGNATURES.items():
        if hasattr(lib, name):
            fn = getattr(lib, name)
            assert list(fn.argtypes) == list(args) and fn.restype == res, name
