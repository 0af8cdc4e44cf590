"""Build of specwise's native kernels (a plain C shared library loaded with ctypes).

The kernels are compiled once by `pip install` without machine-specific flags: each function that needs AVX2 or
AVX-512 carries its own target attribute and the library chooses one path at run time from the CPU's flags: one
table of every kernel's loops per path (qkernels, quant_internal.h; specwise_q_isa, specwise_q_set_isa lowers it).
The extension is optional: where no C compiler is available the package installs without it and uses the torch
path.
"""

from setuptools import Extension, setup

KERNELS = "specwise/models/kernels"

setup(
    ext_modules=[
        Extension(
            "specwise.models.kernels._native",
            sources=[
                f"{KERNELS}/{name}"
                for name in (
                    "module.c",
                    "smallgemm.c",
                    "quant_repack.c",
                    "quant_gemm.c",
                    "quant_portable.c",
                    "quant_avx2.c",
                    "quant_avx512.c",
                    "logits.c",
                    "qllama.c",
                    "attention.c",
                    "sample.c",
                    "suffix.c",
                    "spm.c",
                )
            ],
            depends=[
                f"{KERNELS}/{name}"
                for name in (
                    "quant.h",
                    "quant_internal.h",
                    "quant_simd.inc",
                    "qllama_internal.h",
                    "specwise.h",
                )
            ],
            extra_compile_args=["-O3", "-std=c11", "-fopenmp", "-fno-math-errno"],
            extra_link_args=["-fopenmp"],
            libraries=["m"],
            optional=True,
        )
    ]
)
