"""What flodl-hf may write, and how: atomic writes (``atomic``), directory locks (``dirlock``) and the ownership
rules that keep flodl-hf from writing, moving or deleting a file it did not create (``ownership``); and the one
reader of the files a user hands it (``reader``).

They sit in one package because every writer (checkpoints, the train job's output directory, exports, the CLI's
``--json`` files) follows the same three rules. Nothing is imported here.
"""

__all__: list[str] = []
