"""Every tritonserver `s2t serve` starts has the hook preloaded (its guard against requests that would kill Triton
2.51's front ends), with or without a front inside it; the caller's own preloads are kept behind it."""
import pytest

from s2t.serve.server_hook import PRELOAD_REST, ServerHookError, preloaded


@pytest.mark.parametrize("preload", [None, "/x/libjemalloc.so"], ids=["no-preload", "a-preload-kept"])
def test_the_hook_is_preloaded_first_and_told_what_to_leave_to_the_stubs(tmp_path, preload):
    hook = tmp_path / "libs2t_grpc_front_hook.so"
    hook.write_bytes(b"")
    env = {"PATH": "/bin"} | ({"LD_PRELOAD": preload} if preload else {})
    made = preloaded(env, hook)
    assert made["LD_PRELOAD"].split(":") == [str(hook)] + ([preload] if preload else [])
    assert made[PRELOAD_REST] == (preload or "")
    assert "S2T_GRPC_FRONT_LIBRARY" not in made and env.get("LD_PRELOAD") == preload


def test_a_server_is_never_started_without_the_hook(tmp_path):
    with pytest.raises(ServerHookError, match=r"is not built: `make native` builds it"):
        preloaded({}, tmp_path / "libs2t_grpc_front_hook.so")
    folder = tmp_path / "a folder"
    folder.mkdir()
    (folder / "hook.so").write_bytes(b"")
    with pytest.raises(ServerHookError, match="LD_PRELOAD cannot name"):
        preloaded({}, folder / "hook.so")
