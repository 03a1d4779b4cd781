"""The recorder's modules sit in subpackages (recorder/calls/, hooks/, steps/, ...); the
frames each one skips as hookdbg's own are still the whole package's, not its room's."""

from __future__ import annotations

import os

import pytest

import hookdbg
from hookdbg.recorder import core, runner
from hookdbg.recorder.calls import labels
from hookdbg.recorder.hooks import backward
from hookdbg.recorder.steps import steps

PACKAGE = os.path.dirname(os.path.abspath(hookdbg.__file__))


@pytest.mark.parametrize("module", [labels, backward, steps, core, runner])
def test_hookdbgs_own_frames_are_the_whole_package(module):
    assert module._HOOKDBG_DIR.rstrip(os.sep) == PACKAGE


def test_a_frame_of_the_integrations_is_hookdbgs_own():
    """A Lightning or transformers callback (hookdbg/integrations/) calls the model from
    hookdbg's code: no label, no step root is taken from its frames."""
    frame_file = os.path.join(PACKAGE, "integrations", "session.py")
    for module in (labels, backward, steps):
        assert frame_file.startswith(module._HOOKDBG_DIR)
