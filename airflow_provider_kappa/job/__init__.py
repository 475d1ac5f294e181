"""The job: kappa.yaml (:mod:`.config`), its catalogs (:mod:`.catalogs`) and the one owner of every
path under ``job.checkpoint_root`` (:mod:`.checkpoints`). Used by the live verbs, the landing and
the backfill alike."""
