"""Builds libclattn with CMake from the checkout this folder sits in, and
bundles the shared library inside the package (clattn/libclattn.so.N).

    pip install ./python

CMAKE_ARGS, when set, is passed to CMake's configure step as extra
arguments (e.g. -DCMAKE_C_COMPILER=clang); CLATTN_SOURCE_DIR names the
checkout when this folder was copied out of it.
"""
import glob
import os
import shlex
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("CLATTN_SOURCE_DIR") or os.path.dirname(HERE)


class BuildWithLibrary(build_py):
    """build_py, then the shared library beside the package's modules."""

    def run(self):
        super().run()
        if not os.path.isfile(os.path.join(ROOT, "CMakeLists.txt")):
            raise RuntimeError(f"clattn: no CMakeLists.txt in {ROOT}: build the package from "
                               "the clattn checkout (pip install ./python)")
        temp = os.path.join(os.path.abspath(self.get_finalized_command("build").build_temp),
                            "libclattn")
        configure = ["cmake", "-S", ROOT, "-B", temp, "-DBUILD_SHARED_LIBS=ON",
                     "-DCMAKE_BUILD_TYPE=Release", "-DCLATTN_BUILD_TESTS=OFF",
                     "-DCLATTN_BUILD_CLI=OFF", "-DCLATTN_BUILD_EXAMPLES=OFF",
                     "-DCLATTN_INSTALL=OFF"] + shlex.split(os.environ.get("CMAKE_ARGS", ""))
        subprocess.run(configure, check=True)
        jobs = str(os.cpu_count() or 1)
        subprocess.run(["cmake", "--build", temp, "--target", "clattn", "-j", jobs], check=True)
        libs = [p for p in glob.glob(os.path.join(temp, "libclattn.so.*"))
                if not os.path.islink(p)]
        sonames = [p for p in glob.glob(os.path.join(temp, "libclattn.so.*"))
                   if os.path.islink(p)]
        if len(libs) != 1 or len(sonames) != 1:
            raise RuntimeError(f"clattn: expected one libclattn.so.N in {temp}, found "
                               f"{libs + sonames}")
        dest = os.path.join(self.build_lib, "clattn", os.path.basename(sonames[0]))
        shutil.copyfile(libs[0], dest)
        os.chmod(dest, 0o755)


class BinaryDistribution(Distribution):
    """The wheel carries a shared library: tag it for this platform."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithLibrary}, distclass=BinaryDistribution)
