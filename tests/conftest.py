import os

# Set before transformers / huggingface_hub are imported: offline Hub calls fail at once instead of retrying.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

# The markers transformers' common model tests carry (tests/test_transformers_common.py runs them).
TRANSFORMERS_MARKERS = (
    "accelerate_tests", "flash_attn_test", "flash_attn_3_test", "flash_attn_4_test", "is_agent_test",
    "is_expert_parallel_test", "is_fsdp_test", "is_pipeline_test", "is_staging_test", "is_tensor_parallel_test",
    "is_training_test", "order", "torch_compile_test",
)


# The research tier: the files that test the research code (benchmarks/, experiments/ and the scripts that run them),
# not the library. pytest_collection_modifyitems marks their tests `research`; `make test-library` leaves them out.
RESEARCH_TEST_FILES = frozenset({
    "test_benchmark.py", "test_gpu_check.py", "test_harness.py", "test_images_2d_report.py", "test_needle.py",
    "test_novels.py", "test_onnx_benchmark.py", "test_real_data.py", "test_recall.py", "test_sentence_embeddings.py",
    "test_transfer_diagnosis.py",
})  # fmt: skip


def pytest_configure(config):
    for marker in TRANSFORMERS_MARKERS:
        config.addinivalue_line("markers", f"{marker}: a marker of transformers' common model tests")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in RESEARCH_TEST_FILES:
            item.add_marker(pytest.mark.research)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def hf_modules_cache(tmp_path_factory):
    """A private cache for remote-code modules, so tests never touch the user's ~/.cache."""
    path = tmp_path_factory.mktemp("hf_modules")
    os.environ["HF_MODULES_CACHE"] = str(path)
    return path


@pytest.fixture
def one_thread():
    """Tiny models train faster on one thread: on two shared cores a second thread costs more in
    synchronisation than it saves."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
