"""The tsp example's grader as a package (Coral's packaged form: task.yaml `grader.entrypoint`)."""
