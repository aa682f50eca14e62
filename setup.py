"""The wheel carries the wire format's Python code, generated from wire/*.proto at build time (never committed)."""
from setuptools import setup
from setuptools.command.build_py import build_py

# proto -> whether it has a gRPC service.
PROTOS = {"wire/skill.proto": True, "wire/tf_example.proto": False}


class BuildWithWireFormat(build_py):
    def run(self):
        super().run()
        if self.editable_mode:  # a checkout: `make proto` writes the code beside the .proto files
            return
        from grpc_tools import protoc
        for proto, has_service in PROTOS.items():
            args = ["grpc_tools.protoc", "-I.", f"--python_out={self.build_lib}"]
            if has_service:
                args.append(f"--grpc_python_out={self.build_lib}")
            if protoc.main(args + [proto]) != 0:
                raise RuntimeError(f"protoc failed on {proto}")


setup(cmdclass={"build_py": BuildWithWireFormat})
