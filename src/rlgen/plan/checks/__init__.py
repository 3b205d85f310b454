"""Every check before a run starts, each problem one sentence with its fix: single settings in range
(``values``), settings a switched-off feature ignores (``ignored``), checks that span several settings
(``spanning``), what the run reads and writes (``inputs``), the machine (``machine``) and the room on its disks
for what the run writes (``disk_room``). ``plan.preflight`` runs them all."""
