"""Secrets never in the clear: the masking policy by name and by value, the private job files, and
a local job with secrets planted everywhere whose every output and file is searched for them.
Here the tests that run in one process; those that start processes are tests/integration/test_secrets.py."""

from __future__ import annotations

import io
import json

from container.toolkit.rank_logs import TAIL_BYTES, _Tail
from launcher.local import store
from launcher.local.spec import LocalJobSpec
from launcher.wire.masking import (
    Masker,
    StreamMasker,
    is_secret_name,
    mask_command,
    mask_secrets,
    mask_value,
)
from launcher.wire.opt_ml import write_opt_ml
from tests.support.masking_cases import mode

# --- by name --------------------------------------------------------------------------------------

SECRET_NAMES = ["hf_token", "HF_TOKEN", "wandb_api_key", "db_password", "MY_PASS", "GITHUB_PAT", "passwd",
                "auth", "x-api-key", "apikey", "apiKey", "HFToken", "clientSecret", "AWS_SECRET_ACCESS_KEY",
                "GOOGLE_APPLICATION_CREDENTIALS", "private_key", "PRIVATE", "DB_PWD", "pwd", "api_keys",
                "deployToken", "hftoken", "dbpassword", "smtp.pass", "Basic-Auth"]
NOT_SECRET_NAMES = ["tokenizer", "TOKENIZERS_PARALLELISM", "keyboard", "path", "PATH", "patience", "author",
                    "passthrough", "bypass", "compat", "oauth", "pad_token", "eos_token", "special_tokens",
                    "PWD", "OLDPWD", "username", "lr", "NCCL_DEBUG", "HF_HOME", "model_type", "privacy"]


def test_secret_names_are_recognised_by_their_words():
    assert [n for n in SECRET_NAMES if not is_secret_name(n)] == []
    assert [n for n in NOT_SECRET_NAMES if is_secret_name(n)] == []


def test_counts_special_tokens_and_tokenizers_stay_visible():
    hp = {"num_key_value_heads": "8", "max_tokens": 100, "use_auth": True, "pad_token": "<pad>",
          "tokenizer": "meta-llama/Llama-3.1-8B", "hf_token": "hf_abcdefgh", "eos_token_id": [1, 2]}
    assert mask_secrets(hp) == {"num_key_value_heads": "8", "max_tokens": 100, "use_auth": True,
                                "pad_token": "<pad>", "tokenizer": "meta-llama/Llama-3.1-8B", "hf_token": "****",
                                "eos_token_id": [1, 2]}


def test_a_described_job_is_masked_by_name_and_by_value():
    desc = {
        "HyperParameters": {"hf_token": '"hf_DescribedToken1"', "api_keys": '["k"]', "epochs": "3"},
        "Environment": {"DATABASE_URL": "postgresql://admin:DbPassw0rd!@db.internal:5432/app",
                        "WANDB_API_KEY": "wandbKey42x", "NCCL_DEBUG": "INFO"},
        "FailureReason": "401 for hf_DescribedToken1; wandb wandbKey42x; db DbPassw0rd! refused",
        "Tags": [{"Key": "team", "Value": "nlp"}, {"Key": "deploy-token", "Value": "tagToken99"}],
        "Notes": ["tagToken99 rotated"],
        "Keys": {"api_keys": ["key-one-1", "key-two-2"]},
    }
    assert mask_secrets(desc) == {
        "HyperParameters": {"hf_token": "****", "api_keys": "****", "epochs": "3"},
        "Environment": {"DATABASE_URL": "postgresql://admin:****@db.internal:5432/app",
                        "WANDB_API_KEY": "****", "NCCL_DEBUG": "INFO"},
        "FailureReason": "401 for ****; wandb ****; db **** refused",
        "Tags": [{"Key": "team", "Value": "nlp"}, {"Key": "deploy-token", "Value": "****"}],
        "Notes": ["**** rotated"],
        "Keys": {"api_keys": ["****", "****"]},
    }


def test_a_findings_value_is_masked_by_its_paths_last_part():
    assert mask_value("hyperparameters.hf_token", "hf_x") == "****"
    assert mask_value("environment", {"MY_PASS": "pw", "HOME": "/h"}) == {"MY_PASS": "****", "HOME": "/h"}
    assert mask_value("inputs.train", "https://u:secretpw@host/x") == "https://u:****@host/x"


# --- by value -------------------------------------------------------------------------------------

def test_values_are_replaced_anywhere_longest_first_and_short_ones_are_left():
    mask = Masker(["hf_abc12345", "hf_abc12345XYZ", "ab1"])
    assert mask("a hf_abc12345XYZ b hf_abc12345c ab1") == "a **** b ****c ab1"


def test_json_encoded_multi_line_and_escaped_forms_are_masked():
    mask = Masker.of({"hf_token": '"hf_fromJSON99"',
                      "private_key": "-----BEGIN KEY-----\nMIIEsecretBody\n-----END KEY-----",
                      "db_password": 'pa"ss\\word'})
    assert mask("--hf_token hf_fromJSON99") == "--hf_token ****"
    assert mask("-----BEGIN KEY-----\nMIIEsecretBody\n") == "****\n****\n"
    assert mask(json.dumps({"p": 'pa"ss\\word'})) == '{"p": "****"}'


def test_url_passwords_are_masked_whatever_the_key():
    mask = Masker()
    assert mask("db postgresql://admin:p@ss:w0rd@db.example.com:5432/app ok") == \
        "db postgresql://admin:****@db.example.com:5432/app ok"
    for plain in ("https://example.com:8080/path", "redis://cache:6379 mail admin@example.com", "s3://bucket/k"):
        assert mask(plain) == plain


def test_the_command_line_hides_secret_options_whatever_their_length():
    cmd = ["python", "job.py", "--db_password", "pw", "--hf_token", "hf_LongToken1", "--num_key_value_heads", "8",
           "--note", "uses hf_LongToken1", "--api_key=abc", "--lr", "0.1"]
    assert mask_command(cmd, Masker(["hf_LongToken1"])) == [
        "python", "job.py", "--db_password", "****", "--hf_token", "****", "--num_key_value_heads", "8",
        "--note", "uses ****", "--api_key=****", "--lr", "0.1"]


def test_a_secret_cut_by_any_piece_boundary_is_still_masked():
    text = b"step 1\r 50%|## progress hf_SplitSecret99 ok\rdone\n"
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1, 7):
            stream = StreamMasker(Masker(["hf_SplitSecret99"]))
            out = stream.feed(text[:i]) + stream.feed(text[i:j]) + stream.feed(text[j:]) + stream.feed(b"", final=True)
            assert out == b"step 1\r 50%|## progress **** ok\rdone\n", (i, j)


def test_only_a_possible_start_of_a_secret_waits_for_the_next_piece():
    stream = StreamMasker(Masker(["hf_SplitSecret99"]))
    assert stream.feed(b"\r 10%|#") == b"\r 10%|#"  # a progress bar flows as it is drawn
    assert stream.feed(b"token hf_Sp") == b"token "
    assert stream.feed(b"litSecret99 ok\n") == b"**** ok\n"
    assert stream.feed(b"url postgresql://admin:pa") == b"url "  # a URL password may still come
    assert stream.feed(b"ss1234@db/x\n") == b"postgresql://admin:****@db/x\n"


def test_a_rank_line_longer_than_the_tail_is_masked_across_the_cut(tmp_path):
    path = tmp_path / "stdout.log"
    secret = b"hf_RankLogSecret7"
    path.write_bytes(b"x" * TAIL_BYTES + secret[:6])  # no newline: forced out before the line ends
    out = io.BytesIO()
    tail = _Tail(str(path), out, Masker([secret.decode()]))
    tail.copy(final=False)
    with path.open("ab") as f:
        f.write(secret[6:] + b" end\n")
    tail.copy(final=False)
    tail.copy(final=True)
    tail.file.close()
    assert out.getvalue() == b"x" * TAIL_BYTES + b"**** end\n"


# --- private files --------------------------------------------------------------------------------


def test_the_opt_ml_config_is_private_even_when_written_again(tmp_path):
    config = tmp_path / "input" / "config"
    config.mkdir(parents=True, mode=0o755)
    config.chmod(0o755)
    write_opt_ml(tmp_path, hyperparameters={"hf_token": '"hf_x"'}, current_host="algo-1", hosts=["algo-1"],
                 instance_type="local", channels={})
    assert mode(config) == 0o700
    assert {p.name: mode(p) for p in config.iterdir()} == {
        "hyperparameters.json": 0o600, "resourceconfig.json": 0o600, "inputdataconfig.json": 0o600}


def test_the_record_spec_and_compose_file_are_private(tmp_path):
    from launcher.local.docker import write_compose_file

    store.write(tmp_path, {"Environment": {"HF_TOKEN": "hf_x"}})
    spec = LocalJobSpec(name="j", job_dir=tmp_path, hosts=["algo-1"], instance_type="local", processes_per_host=1,
                        hyperparameters={}, channels={}, environment={"HF_TOKEN": "hf_x"},
                        checkpoint_dir=tmp_path / "ckpt", max_run=60)
    spec.save()
    compose = write_compose_file(spec)
    assert "hf_x" in compose.read_text()
    assert {p.name: mode(p) for p in tmp_path.iterdir()} == {
        "job.json": 0o600, "spec.json": 0o600, compose.name: 0o600}


# --- a local job with secrets everywhere ----------------------------------------------------------




AZURE = ("DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=azKey0123+/abc==;EndpointSuffix=core.windows.net",
         "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey=sbKey0123=",
         "BlobEndpoint=https://a.blob.core.windows.net/;SharedAccessSignature=sv=2020-08-04&ss=b&sig=sasSig0123%3D")
DSN = "https://dsnKey0123456789@o1.ingest.sentry.io/42"


def test_azure_key_fragments_and_url_user_info_are_masked_under_any_key():
    """Issue 31, item 13: an Azure connection string's keys and a Sentry DSN's key (user-info
    without a password) showed under a key that does not name a secret."""
    shown = mask_secrets({"storage": AZURE[0], "bus": AZURE[1], "blob": AZURE[2], "sentry": DSN,
                          "log": "retrying with azKey0123+/abc== and dsnKey0123456789"})
    text = json.dumps(shown)
    for secret in ("azKey0123+/abc==", "sbKey0123=", "sasSig0123", "dsnKey0123456789"):
        assert secret not in text
    assert shown["storage"] == ("DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=****;"
                                "EndpointSuffix=core.windows.net")  # the rest of the string stays readable
    assert shown["sentry"] == "https://****@o1.ingest.sentry.io/42"
    assert shown["log"] == "retrying with **** and ****"  # by value elsewhere
    assert mask_secrets({"page": "https://host/path@x and a@b.c"}) == {"page": "https://host/path@x and a@b.c"}


def test_a_key_fragment_cut_by_a_piece_boundary_is_still_masked():
    stream = StreamMasker(Masker())
    text = AZURE[0].encode()
    cut = text.index(b"abc==")
    out = stream.feed(text[:cut]) + stream.feed(text[cut:], final=True)
    assert b"azKey0123" not in out and b"AccountKey=****;EndpointSuffix" in out
