"""The rollout steps' config reads: the file read every time, parsed again only when its text changed, a bounded
number of parses kept."""
import pytest

from s2t.control import config_cache

SCORER = 'name: "risk_scorer"\nversion_policy: { all: {} }\n'


def write(folder, text):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(text)
    return folder


@pytest.mark.parametrize("second, parsed_again, name", [
    (SCORER, False, "risk_scorer"),  # untouched: the same config
    (SCORER.replace("risk_scorer", "risk_scorer_lite"), True, "risk_scorer_lite"),  # edited in place
    (SCORER + "max_batch_size: 8\n", True, "risk_scorer"),  # a line added
])
def test_a_config_is_parsed_again_only_when_its_text_changed(tmp_path, second, parsed_again, name):
    folder = write(tmp_path / "risk_scorer", SCORER)
    first = config_cache.load(folder)
    write(folder, second)
    again = config_cache.load(folder)
    assert (again is not first) is parsed_again
    assert again.name == name


def test_the_same_text_in_another_folder_is_that_folders_own_config(tmp_path):
    one, other = write(tmp_path / "one", "name: ["), write(tmp_path / "other", "name: [")
    with pytest.raises(ValueError, match="one/config.pbtxt"):
        config_cache.load(one)
    with pytest.raises(ValueError, match="other/config.pbtxt"):
        config_cache.load(other)


def test_a_config_that_does_not_parse_is_refused_at_every_read(tmp_path):
    folder = write(tmp_path / "risk_scorer", "version_policy: { nothing: {} }\n")
    for _ in range(2):
        with pytest.raises(ValueError, match="config.pbtxt"):
            config_cache.load(folder)


def test_the_parsed_configs_kept_are_bounded(tmp_path):
    folder = write(tmp_path / "risk_scorer", SCORER)
    first = config_cache.load(folder)
    for number in range(config_cache.CONFIGS_KEPT):
        config_cache.load(write(tmp_path / f"model_{number}", f'name: "model_{number}"\n'))
    assert config_cache.load(folder) is not first, "the oldest parse was dropped to keep the bound"
    assert config_cache.load(folder).name == "risk_scorer"


def test_a_config_validated_before_it_is_written_is_read_back_without_a_second_parse(tmp_path):
    from s2t.control.config_edit import replace_config
    from s2t.control.version_store import VersionStore

    repository = tmp_path / "model_repository"
    folder = write(repository / "risk_scorer", SCORER)
    edited = SCORER.replace("all: {}", "latest: { num_versions: 1 }")
    replace_config(VersionStore(repository), folder / "config.pbtxt", edited)
    assert (folder / "config.pbtxt").read_text() == edited
    assert config_cache.load(folder) is config_cache.parsed(edited, str(folder / "config.pbtxt"))
