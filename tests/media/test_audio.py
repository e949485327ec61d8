"""The PyAV audio loader: any codec, mono, at the model's rate, in windows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from media_files import cfr_video, write_audio

from mmbatch.errors import ConfigError, MediaError
from mmbatch.media.audio import audio_windows, decode_audio, probe_audio
from mmbatch.media.options import AudioOptions
from mmbatch.types import TimeSpan


def dominant_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples))
    return float(np.fft.rfftfreq(samples.size, 1 / rate)[spectrum.argmax()])


def test_8k_stereo_wav_becomes_16k_mono_at_the_same_level_and_pitch(tmp_path: Path) -> None:
    path = write_audio(tmp_path / "st.wav", rate=8000, seconds=2.5, layout="stereo")
    info = probe_audio(str(path))
    assert (info.sample_rate, info.channels, info.duration) == (8000, 2, 2.5)
    samples = decode_audio(str(path), 16000)
    assert samples.dtype == np.float32
    assert samples.ndim == 1
    assert abs(samples.size - 40000) <= 16  # 2.5 s at 16 kHz, give or take the filter delay
    # Equal channels average to the same tone: amplitude 0.5, still 440 Hz.
    assert np.abs(samples[1000:-1000]).max() == pytest.approx(0.5, abs=0.01)
    assert dominant_hz(samples, 16000) == pytest.approx(440, abs=1)


@pytest.mark.parametrize(("suffix", "codec"), [("ogg", "libopus"), ("flac", "flac")])
def test_compressed_codecs_decode_too(tmp_path: Path, suffix: str, codec: str) -> None:
    path = write_audio(tmp_path / f"a.{suffix}", rate=48000, seconds=2, layout="mono", codec=codec)
    samples = decode_audio(str(path), 16000)
    assert abs(samples.size - 32000) < 800  # opus pads its start
    assert dominant_hz(samples, 16000) == pytest.approx(440, abs=1)


def test_a_window_is_the_same_samples_as_that_stretch_of_the_whole(tmp_path: Path) -> None:
    path = write_audio(tmp_path / "w.wav", rate=16000, seconds=3, layout="mono", freq=250)
    whole = decode_audio(str(path), 16000)
    part = decode_audio(str(path), 16000, TimeSpan(1.25, 2.0))
    assert part.size == 12000
    np.testing.assert_allclose(part, whole[20000:32000], atol=1e-4)


def test_windows_cover_the_file_with_the_overlap_asked() -> None:
    spans = audio_windows(70.0, AudioOptions(window_s=30, overlap_s=5))
    assert spans == [TimeSpan(0, 30), TimeSpan(25, 55), TimeSpan(50, 70)]
    assert audio_windows(3.0, AudioOptions()) == [TimeSpan(0, 3.0)]
    with pytest.raises(ConfigError, match="overlap_s"):
        AudioOptions(window_s=10, overlap_s=10)


def test_a_file_without_audio_says_so(tmp_path: Path) -> None:
    path = cfr_video(tmp_path / "silent.mp4", frames=5)
    with pytest.raises(MediaError, match=r"no audio stream \(streams: video\)"):
        decode_audio(str(path), 16000)
    with pytest.raises(MediaError, match="no audio stream"):
        probe_audio(str(path))


def test_not_audio_at_all_is_a_decode_error(tmp_path: Path) -> None:
    path = tmp_path / "text.wav"
    path.write_text("hello, not audio")
    with pytest.raises(MediaError, match="not a media file") as info:
        decode_audio(str(path), 16000)
    assert info.value.stage == "decode"
