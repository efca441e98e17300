"""The JSON schema of job files (configs/schema.json is generated from it; a test keeps it in sync)."""

from launcher.config import JobFile


def job_file_schema() -> dict:
    schema = JobFile.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "smlaunch job file"
    return schema
