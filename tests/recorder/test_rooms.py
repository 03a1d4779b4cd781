"""The recorder's modules sit in subpackages (recorder/calls/, hooks/, steps/, ...); the
frames each one skips as hookdbg's own are still the whole package's, not its room's."""

from __future__ import annotations

import os

import pytest

import hookdbg
from hookdbg.recorder import core, runner
from hookdbg.recorder.calls import labels
from hookdbg.recorder.steps import steps

PACKAGE = os.path.dirname(os.path.abspath(hookdbg.__file__))
# the package's frames, as each module that skips them names them (calls/labels.py's
# are shared by hooks/backward.py and alerts/pinpoint.py)
OWN = (labels.HOOKDBG_DIR, steps._HOOKDBG_DIR)


@pytest.mark.parametrize(
    "own", [labels.HOOKDBG_DIR, steps._HOOKDBG_DIR, core._HOOKDBG_DIR, runner._HOOKDBG_DIR]
)
def test_hookdbgs_own_frames_are_the_whole_package(own):
    assert own.rstrip(os.sep) == PACKAGE


def test_a_frame_of_the_integrations_is_hookdbgs_own():
    """A Lightning or transformers callback (hookdbg/integrations/) calls the model from
    hookdbg's code: no label, no step root is taken from its frames."""
    frame_file = os.path.join(PACKAGE, "integrations", "session.py")
    for own in OWN:
        assert frame_file.startswith(own)
