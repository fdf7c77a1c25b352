"""The Teacher: the OpenAI-compatible client, reply normalisation, a launched llama-server, and teacher-sim."""
