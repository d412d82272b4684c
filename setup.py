"""Build and install pipert (pure Python parts; the pipert._C extension is added by csrc/)."""
from setuptools import find_packages, setup

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
        "test": ["pytest", "hypothesis", "triton>=3.0"],
    },
    entry_points={"console_scripts": ["pipert=pipert.cli:main"]},
)
