"""What outlives a run's process: checkpoints (``checkpoint``, with the folder format in ``checkpoint_folder``; the
last one, or the weights alone where it cannot fit, in ``final_checkpoint``), which checkpoint ``resume=``
continues (``resume``), room on disk (``disk_space``), folders other nodes read and
write (``shared_folders``), status.json (``status_file``) and the one-run-per-folder lock (``run_lock``)."""
