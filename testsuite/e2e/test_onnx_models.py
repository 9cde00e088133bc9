"""Models exported by PyTorch (testsuite/onnx/models, made by export.py with
torch.onnx.export): compiled unmodified with a bound batch size, run on the
stored inputs, compared with PyTorch's outputs (relative error <= 1e-5; 5e-3
with --matmul-precision=tf32, whose operands keep 10 bits of mantissa, on the
GPU and under --gpu-sim alike)."""
import os
import shutil
import tempfile

from harness import EXTRA_FLAGS, NOVAC, NOVARUN, case, check_close, read_pb, run

TOL = 5e-3 if "--matmul-precision=tf32" in EXTRA_FLAGS else 1e-5

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODELS = os.path.join(ROOT, "testsuite", "onnx", "models")


def check_model(name):
    def go():
        src = os.path.join(MODELS, name)
        data = os.path.join(src, "test_data_set_0")
        d = tempfile.mkdtemp(prefix="nova-onnx-")
        try:
            so = os.path.join(d, "m.so")
            run([NOVAC, os.path.join(src, "model.onnx"), "--dim=batch=4", "-o", so])
            run([NOVARUN, so, "--inputs", data, "--outputs", os.path.join(d, "out"), "-q"])
            for i, what in enumerate(("logits", "loss")):
                got = read_pb(os.path.join(d, "out", "output_%d.pb" % i))
                ref = read_pb(os.path.join(data, "output_%d.pb" % i))
                check_close(got, ref, TOL, what)
        finally:
            shutil.rmtree(d, ignore_errors=True)
    case("onnx_models.%s" % name, go)


for m in ("mlp", "cnn", "gpt_block"):
    check_model(m)


def test_external_data():
    """The MLP with its weights in an external data file."""
    import onnx
    src = os.path.join(MODELS, "mlp")
    data = os.path.join(src, "test_data_set_0")
    d = tempfile.mkdtemp(prefix="nova-onnx-")
    try:
        m = onnx.load(os.path.join(src, "model.onnx"))
        onnx.save_model(m, os.path.join(d, "ext.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                        location="weights.bin", size_threshold=0)
        if not os.path.exists(os.path.join(d, "weights.bin")):
            raise Exception("the model was not saved with external data")
        so = os.path.join(d, "m.so")
        run([NOVAC, os.path.join(d, "ext.onnx"), "--dim=batch=4", "-o", so])
        run([NOVARUN, so, "--inputs", data, "--outputs", os.path.join(d, "out"), "-q"])
        check_close(read_pb(os.path.join(d, "out", "output_0.pb")), read_pb(os.path.join(data, "output_0.pb")), TOL)
        os.remove(os.path.join(d, "weights.bin"))
        p = run([NOVAC, os.path.join(d, "ext.onnx"), "--dim=batch=4", "-o", so], expect_rc=1)
        if "weights.bin" not in p.stderr:
            raise Exception("a missing external data file should be named:\n" + p.stderr)
    finally:
        shutil.rmtree(d, ignore_errors=True)


case("onnx_models.external_data", test_external_data)
