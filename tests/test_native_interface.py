"""The native library's one interface: specwise/models/kernels/specwise.h.

Every ctypes binding in the package is checked against the header's prototypes (argument count, each C type
mapped to its ctypes type, the return type); every function the built library exports is declared there, and
every declared one is bound. Every ctypes ``Structure`` of the package is checked against its ``typedef struct`` in
quant.h or specwise.h (field names, order, each C type mapped to its ctypes type; a struct held by value inside
another by its name), and every struct there has its binding.
"""

import ctypes
import importlib
import platform
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
# Only these are built off x86-64 (the float32 kernels need AVX2 and are left out elsewhere).
X86_ONLY = {"specwise_small_gemm", "specwise_small_gemm_f16", "specwise_llama_layers"}


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
        return True  # any pointer may be passed as an address
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
    assert not mismatches("specwise_a", fn([ctypes.POINTER(ctypes.POINTER(ctypes.c_float)), i64, p], i64),
                          found["specwise_a"])  # fmt: skip
    assert mismatches("specwise_a", fn([p, ctypes.c_int, p], i64), found["specwise_a"])  # int64_t bound as int
    assert mismatches("specwise_a", fn([p, i64], i64), found["specwise_a"])  # an argument missing
    assert mismatches("specwise_a", fn([p, i64, p], ctypes.c_int), found["specwise_a"])  # wrong return type
    assert mismatches("specwise_a", fn([i64, i64, p], i64), found["specwise_a"])  # a pointer bound as an integer
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
    assert struct_mismatches(structure(*right[:3], ("norm", i64), *right[4:]), fields)  # a pointer as an integer
    with pytest.raises(ValueError, match="defined twice"):
        parse_structs("typedef struct { int a; } x;\ntypedef struct { int b; } x;")


def test_every_structure_matches_its_c_struct():
    structs = parse_structs(TYPES.read_text()) | parse_structs(HEADER.read_text())
    ours = package_structures()
    layer_structs = {"QShape", "QLayers", "QRows", "QWork", "QRun", "QModel", "QPass", "QHead", "QStep", "QLogits"}
    layer_structs |= {"FLayers", "FRows"}  # the float32 layers' (specwise_llama_layers)
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
    expected = set(declared) if platform.machine() in ("x86_64", "AMD64") else set(declared) - X86_ONLY
    missing = sorted(expected - exported)
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
