"""Which device a run resolves to, and the machine fault of Triton's CPU interpreter before 3.7 under numpy 2.4
(sandbox/device.py): named as the machine's, with what to install, only where those versions meet."""
import pytest

from sandbox.device import NUMPY_SCALAR_ERROR, interpreter_fault, resolve_device

RAISED = f"InterpreterError: TypeError('{NUMPY_SCALAR_ERROR}')"


@pytest.mark.parametrize("triton_version,numpy_version", [("3.6.0", "2.4.6"), ("3.5.1", "2.4.0rc1"),
                                                          ("3.6.0", "3.0.0")])
def test_the_interpreter_fault_is_named_with_what_to_install(triton_version, numpy_version):
    fault = interpreter_fault(RAISED, (triton_version, numpy_version))
    assert fault is not None
    assert f"Triton {triton_version}'s CPU interpreter" in fault and f"numpy {numpy_version}" in fault
    assert "numpy<2.4" in fault and "Triton 3.7 or newer" in fault


@pytest.mark.parametrize("triton_version,numpy_version", [("3.7.0", "2.4.6"), ("3.9.0", "2.4.6"),
                                                          ("3.6.0", "2.3.5"), ("3.6.0", "1.26.4")])
def test_versions_without_the_fault_leave_the_candidates_error_its_own(triton_version, numpy_version):
    assert interpreter_fault(RAISED, (triton_version, numpy_version)) is None


def test_another_error_is_the_candidates_own_on_a_machine_with_the_fault():
    assert interpreter_fault("InterpreterError: TypeError('unsupported operand')", ("3.6.0", "2.4.6")) is None


def test_a_device_the_run_cannot_use_gets_one_sentence():
    with pytest.raises(ValueError, match="use cpu or cuda"):
        resolve_device("tpu")
    assert resolve_device("cpu") == "cpu"
