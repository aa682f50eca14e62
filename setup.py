"""The wheel carries the wire format's Python code, generated from s2t/wire/*.proto at build time (never committed), the
in-process Triton backend (native/), compiled for the Python that builds it, and the gRPC front of the embedded
server (native/grpc_front.cc: the library tritonserver loads, which needs Debian's libgrpc++1.51 and libprotobuf32
where it runs, its hook, and the binary, gRPC and protobuf linked in statically), and its HTTP front
(native/http_front.cc, which needs Debian's libevent-2.1-7 where it runs): a platform wheel."""
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import find_namespace_packages, setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

# proto -> whether it has a gRPC service.
PROTOS = {"s2t/wire/skill.proto": True, "s2t/wire/tf_example.proto": False}
# One installed top-level package, s2t (generic names such as `backends` in site-packages would collide with other
# distributions'). Two of its packages live at the top level of the repository, beside model_repository/ and
# ensembles/: package -> its folder. s2t/project_imports.py PACKAGE_DIRS is the same mapping for the tools that
# read the sources by path (tests/unit/test_layout.py holds the two equal).
PACKAGE_DIRS = {"s2t.backends": "backends", "s2t.clients": "clients"}


def packages() -> list[str]:
    """s2t's packages under s2t/, then the mapped ones (folders without __init__.py too: the Python-based
    backend's onnxruntime/, the clients' examples/)."""
    found = find_namespace_packages(include=["s2t", "s2t.*"], exclude=["*__pycache__*"])
    for package, folder in PACKAGE_DIRS.items():
        subpackages = find_namespace_packages(folder, exclude=["*__pycache__*"])
        found += [package, *(f"{package}.{sub}" for sub in subpackages)]
    return found


class BuildWithWireFormat(build_py):
    def run(self):
        super().run()
        if self.editable_mode:  # a checkout: `make proto` and `make native` write these in the tree
            return
        from grpc_tools import protoc
        for proto, has_service in PROTOS.items():
            args = ["grpc_tools.protoc", "-I.", f"--python_out={self.build_lib}"]
            if has_service:
                args.append(f"--grpc_python_out={self.build_lib}")
            if protoc.main(args + [proto]) != 0:
                raise RuntimeError(f"protoc failed on {proto}")
        native = Path(self.build_lib, "s2t", "serve", "native", f"python{sysconfig.get_config_var('VERSION')}")
        subprocess.run(["bash", "native/build.sh", sys.executable, str(native.resolve())], check=True)
        front = Path(self.build_lib, "s2t", "serve", "native")
        subprocess.run(["bash", "native/build_grpc_front.sh", str(front.resolve())], check=True)
        subprocess.run(["bash", "native/build_http_front.sh", str(front.resolve())], check=True)


class CompiledDistribution(Distribution):
    """The in-process backend and the gRPC front are native code for one Python and platform: the wheel says so in
    its tags."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithWireFormat}, distclass=CompiledDistribution, packages=packages(),
      package_dir=PACKAGE_DIRS)
