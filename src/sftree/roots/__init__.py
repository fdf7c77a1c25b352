"""Stage 1, root selection (seed section 2): read a Student run, split it into stages, pick and place the roots."""
