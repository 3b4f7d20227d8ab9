"""The recording child checks that its environment gives the settings its bridge records with."""

from __future__ import annotations

from pathlib import Path

from pydantic import SecretStr

from examlops.bootstrap.recording import settings_digest
from examlops.core.settings import BusSettings, RecordingSettings, RedisSettings, Settings


def base(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path, redis=RedisSettings(url="redis://127.0.0.1:6399/0"), secret=SecretStr("s1"))


def test_a_setting_the_recorder_does_not_read_may_differ(tmp_path: Path) -> None:
    settings = base(tmp_path)
    flagged = settings.model_copy(update={"bus": BusSettings(concurrency=7)})  # `exa bridge start --concurrency`
    assert settings_digest(flagged) == settings_digest(settings)


def test_another_secret_redis_or_recording_section_is_caught(tmp_path: Path) -> None:
    settings = base(tmp_path)
    others = [
        settings.model_copy(update={"secret": SecretStr("s2")}),
        settings.model_copy(update={"redis": RedisSettings(url="redis://127.0.0.1:6400/0")}),
        settings.model_copy(update={"recording": RecordingSettings(batch=8)}),
        settings.model_copy(update={"home": tmp_path / "elsewhere"}),
    ]
    assert len({settings_digest(s) for s in [settings, *others]}) == 5
