import os.path as osp
import re

from setuptools import find_packages, setup


def read_requirements(name):
    path = osp.join(osp.dirname(__file__), "requirements", name)
    with open(path) as f:
        lines = (line.split("#")[0].strip() for line in f)
        return [line for line in lines if line]


def read_version():
    path = osp.join(osp.dirname(__file__), "mmgcu", "version.py")
    with open(path) as f:
        return re.search(r'__version__ = "([^"]+)"', f.read()).group(1)


setup(
    name="mmgcu",
    version=read_version(),
    description="Stock OpenMMLab (MMEngine/mmsegmentation) training on Enflame GCU cards",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["mmgcu", "mmgcu.*"]),
    # The configs ship in the wheel where OpenMMLab packages keep theirs (.mim/configs; in a
    # checkout a link to configs/): `mmgcu configs` prints their paths for _base_, and
    # `mmgcu train NAME` finds them.
    package_data={
        "mmgcu": [".mim/configs/*.md", ".mim/configs/**/*.py"],
        "mmgcu.sim": ["csrc/*.cpp", "csrc/*.h"],
    },
    python_requires=">=3.8",
    install_requires=read_requirements("runtime.txt"),
    extras_require={
        "mmseg": read_requirements("optional.txt"),
        "tests": read_requirements("tests.txt"),
    },
    entry_points={"console_scripts": ["mmgcu=mmgcu.cli:main"]},
    classifiers=[
        "Programming Language :: Python :: 3.8",
        "Programming Language :: Python :: 3.11",
        "License :: OSI Approved :: Apache Software License",
    ],
)
