"""Build and install pipert, with the optional extensions from csrc/: pipert._C (against torch) and
pipert._simc (the simulator's hot loops, plain Python C API: no torch, so the simulator starts fast).

Environment switches for the extensions:
  PIPERT_NO_EXT=1   build no extension (pipert uses its pure-Python paths)
  PIPERT_CUDA=1     require the CUDA part (fails when CUDA toolkit or CUDA torch is missing)
  PIPERT_CUDA=0     CPU part only
  (unset)           CUDA part when a CUDA toolkit and a CUDA build of torch are present
"""
import glob
import os

from setuptools import Extension, find_packages, setup

# C11 named explicitly: torch's build_ext otherwise adds its C++ standard to every source
SIMC = Extension("pipert._simc", ["csrc/simc/simc.c", "csrc/simc/nodes.c", "csrc/simc/valmap.c"],
                 depends=["csrc/simc/nodes.h", "csrc/simc/valmap.h"],
                 extra_compile_args=["-O2", "-std=c11"])


def _extension_args() -> dict:
    """ext_modules + cmdclass for pipert._C and pipert._simc; torch is imported only here."""
    if os.environ.get("PIPERT_NO_EXT") == "1":
        return {}
    try:
        from torch.utils import cpp_extension as ce
        import torch
    except ImportError:  # e.g. an isolated build without torch: pipert._C falls back to pure Python
        print("pipert: torch not importable at build time; building without pipert._C")
        return {"ext_modules": [SIMC]}

    want = os.environ.get("PIPERT_CUDA")
    cuda_ok = ce.CUDA_HOME is not None and torch.version.cuda is not None
    if want == "1" and not cuda_ok:
        raise RuntimeError("PIPERT_CUDA=1 needs a CUDA toolkit (CUDA_HOME) and a CUDA build of torch; "
                           f"found CUDA_HOME={ce.CUDA_HOME}, torch.version.cuda={torch.version.cuda}")
    use_cuda = cuda_ok if want is None else want == "1"
    # Few translation units: the bindings (the only one with torch headers) and the small core.
    sources = ["csrc/bindings.cpp"] + sorted(glob.glob("csrc/core/*.cpp"))
    cxx = ["-O2", "-fvisibility=hidden"]  # torch picks the C++ standard
    kwargs = {"include_dirs": [os.path.abspath("csrc")]}
    if use_cuda:
        sources.append("csrc/core/delay_kernels.cu")
        ext = ce.CUDAExtension("pipert._C", sources, define_macros=[("PIPERT_WITH_CUDA", None)],
                               extra_compile_args={"cxx": cxx, "nvcc": ["-O2"]}, **kwargs)
    else:
        ext = ce.CppExtension("pipert._C", sources, extra_compile_args={"cxx": cxx}, **kwargs)
    return {"ext_modules": [ext, SIMC], "cmdclass": {"build_ext": _with_plain_c(ce.BuildExtension)}}


def _with_plain_c(torch_build_ext: type) -> type:
    """torch's build_ext for pipert._C, then setuptools' own for pipert._simc: torch's compiles
    every source as C++ (and patches the compiler for the whole run), so the plain-C module is
    built after it with the compiler's own methods put back."""
    from setuptools.command.build_ext import build_ext

    class BuildExt(torch_build_ext):
        def build_extensions(self) -> None:
            plain = [e for e in self.extensions if e is SIMC]
            self.extensions = [e for e in self.extensions if e is not SIMC]
            saved = {k: getattr(self.compiler, k) for k in ("compile", "_compile")}
            super().build_extensions()
            for k, f in saved.items():
                setattr(self.compiler, k, f)
            self.extensions += plain
            for e in plain:
                build_ext.build_extension(self, e)

    return BuildExt


setup(
    name="pipert",
    version="0.1.0",
    description="Pipeline-parallel training runtime for PyTorch: schedules as data, simulated, emulated, executed",
    python_requires=">=3.10",
    packages=find_packages(include=["pipert", "pipert.*"]) + ["pipert.kernels"],
    package_dir={"pipert.kernels": "kernels"},
    install_requires=["torch>=2.4", "numpy", "matplotlib", "tqdm", "ortools>=9.10"],
    extras_require={
        "kernels": ["triton>=3.0"],
        "test": ["pytest", "pytest-xdist", "hypothesis", "triton>=3.0"],
    },
    entry_points={"console_scripts": ["pipert=pipert.cli:main"]},
    **_extension_args(),
)
