"""Members' files (docs/architecture/files.md): what an upload is by its content
(`sniff`), images checked and re-encoded (`images`), documents' text extracted in a
child process under a time and memory budget (`extract`, `extract_worker`), the service
that stores one whole or not at all (`uploads`); and what models are sent of them
(`for_models`, `ranking`, `signing`).
"""
