"""A model named by its Hugging Face id (`--model-path org/name`) → the local folder the loader reads.

huggingface_hub's snapshot_download does the work, so the standard cache and its settings hold:
HF_HOME / HF_HUB_CACHE (where), HF_HUB_OFFLINE (cache only), HF_ENDPOINT (a mirror), HF_TOKEN
(gated models). Only the files vlserve reads are fetched (CHECKPOINT_FILES; the router's key maker
needs no weights). A local folder always wins (core/model_id.py).
"""

import logging

from vlserve.core.errors import CheckpointError
from vlserve.core.model_id import hub_model_id

log = logging.getLogger(__name__)

WEIGHTS = ["*.safetensors", "model.safetensors.index.json"]
CONFIG_FILES = [
    "config.json", "generation_config.json",
    "tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json",
    "chat_template.jinja", "chat_template.json",
]
CHECKPOINT_FILES = CONFIG_FILES + WEIGHTS


def resolve_model_path(model: str, revision: str | None = None, weights: bool = True) -> str:
    """The folder to load `model` from: itself when it is a local folder (or not shaped like a Hub
    id: the loader then says what is wrong with it), else the id's snapshot in the Hub cache at
    `revision` (a branch, tag or commit; default main), downloaded first unless offline."""
    repo_id = hub_model_id(model)
    if repo_id is None:
        if revision:
            log.warning("--revision %s ignored: %s is a local folder, not a Hugging Face model id", revision, model)
        return model
    from huggingface_hub import snapshot_download

    try:
        path = snapshot_download(repo_id, revision=revision,
                                 allow_patterns=CHECKPOINT_FILES if weights else CONFIG_FILES)
    except Exception as e:  # every failure of the Hub or the cache becomes one start-up error
        raise CheckpointError(_explain(repo_id, revision, e)) from e
    log.info("model %s (revision %s): %s", repo_id, revision or "main", path)
    return path


def _explain(repo_id: str, revision: str | None, error: Exception) -> str:
    from huggingface_hub import constants
    from huggingface_hub.errors import (GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    at = f"{repo_id!r} (revision {revision or 'main'})"
    where = f"no local folder {repo_id!r} exists, and"
    if isinstance(error, LocalEntryNotFoundError) and constants.HF_HUB_OFFLINE:
        return (f"{where} the model {at} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) while "
                f"HF_HUB_OFFLINE is set: download it once with network access (e.g. `hf download {repo_id}`), "
                "point HF_HOME at a cache that has it, or give a local folder")
    if isinstance(error, LocalEntryNotFoundError):
        return (f"{where} the model {at} is neither in the Hugging Face cache ({constants.HF_HUB_CACHE}) nor "
                f"could it be fetched from {constants.ENDPOINT}: {error}")
    if isinstance(error, GatedRepoError):
        return f"the model {at} is gated on {constants.ENDPOINT}: accept its terms and set HF_TOKEN"
    if isinstance(error, RevisionNotFoundError):
        return f"the model {repo_id!r} on {constants.ENDPOINT} has no revision {revision!r}"
    if isinstance(error, RepositoryNotFoundError):
        return (f"{where} {constants.ENDPOINT} has no model {repo_id!r} (or it is private: set HF_TOKEN)")
    return f"the model {at} could not be fetched from {constants.ENDPOINT}: {type(error).__name__}: {error}"
