"""The fast tier (`pytest -m "not slow"`, docs/architecture.md "Tests"): what conftest.py marks slow besides the
tests marked so in their own file.

- SLOW_MARKERS: a test that needs an install or a service beyond `.venv` (Slurm, the OpenCode CLI, the real Coral,
  llama-server, sglang-router, the trainer venv) is slow whatever its own time.
- MEASURED: tests (or whole files) measured at 2 s or more each, set-up and tear-down included (`pytest
  --durations=0` on 2 shared cores); a test that pays a module fixture (tests/test_edge_native_end_to_end.py's
  tree store and edge) makes the next one pay it when it leaves, so such a file leaves whole;
  an entry names a file, `file::test` (all its parameters) or one parametrised id. A test renamed or removed
  fails tests/test_conventions_fast_tier.py until its entry follows it.
"""

from __future__ import annotations

SLOW_MARKERS = ("slurm", "opencode", "coral", "llm", "router", "trainer")

MEASURED: tuple[str, ...] = (
    "tests/security/test_forged_scores.py::test_graded_code_cannot_print_its_own_score",
    "tests/security/test_forged_scores.py::test_graded_code_is_isolated_from_grader_project_and_network",
    "tests/security/test_grading_bounds.py::test_graded_code_nesting_1200_folders_mode_000_and_fifos_is_scored_and_leaves_nothing[stand-in-host-disk]",
    "tests/security/test_host_boundary.py::test_a_backtracking_regex_does_not_freeze_the_host",
    "tests/security/test_host_boundary.py::test_a_fifo_a_link_loop_and_an_infinite_offset_are_each_one_tools_error",
    "tests/security/test_host_boundary.py::test_a_forged_eval_block_in_a_message_or_an_exception_never_reads_as_the_hosts",
    "tests/security/test_host_boundary.py::test_a_late_writer_and_a_hard_link_reach_no_other_branch",
    "tests/security/test_host_boundary.py::test_a_nested_repositorys_filter_driver_never_runs_on_the_host",
    "tests/security/test_host_boundary.py::test_a_node_whose_last_turn_had_no_eval_keeps_the_last_graded_code",
    "tests/security/test_host_boundary.py::test_deep_folders_and_many_sparse_files_are_refused_and_leave_nothing_behind",
    "tests/security/test_host_boundary.py::test_forged_attempt_records_steer_nothing",
    "tests/security/test_host_boundary.py::test_reading_a_huge_sparse_file_costs_the_host_no_memory",
    "tests/security/test_host_boundary.py::test_the_node_keeps_the_graded_code_not_what_followed_the_eval",
    "tests/security/test_host_boundary.py::test_the_sandbox_has_a_disk_quota",
    "tests/security/test_host_boundary.py::test_what_is_graded_ignores_attribute_rules",
    "tests/security/test_host_git.py",
    "tests/security/test_host_text.py::test_graded_codes_forged_lines_never_read_as_the_hosts",
    "tests/security/test_import_coral_hostile.py::test_a_deeply_nested_attempt_record_is_one_problem",
    "tests/security/test_import_coral_hostile.py::test_a_fifo_among_the_git_objects_never_hangs_the_import",
    "tests/security/test_import_coral_hostile.py::test_a_fifo_put_in_after_the_check_ends_the_read_instead_of_hanging",
    "tests/security/test_import_coral_hostile.py::test_a_hostile_config_yaml_is_one_clear_error[nested flow sequences]",
    "tests/security/test_import_coral_hostile.py::test_a_tree_of_millions_of_entries_is_refused_as_it_is_read",
    "tests/security/test_import_coral_hostile.py::test_links_out_of_the_run_are_refused[alternates]",
    "tests/security/test_import_coral_hostile.py::test_terminal_escapes_in_names_are_printed_escaped",
    "tests/security/test_proxy_hostile.py::test_a_wrong_key_gets_403_before_its_body_is_read",
    "tests/security/test_proxy_hostile.py::test_big_bodies_at_once_are_refused_past_the_caps_in_flight",
    "tests/security/test_proxy_hostile.py::test_big_bodies_on_the_own_channel_are_capped",
    "tests/security/test_proxy_hostile.py::test_requests_in_flight_are_capped[per_channel]",
    "tests/security/test_sandbox_escape.py::test_agent_runs_without_capabilities_as_an_unprivileged_user",
    "tests/security/test_sandbox_escape.py::test_output_is_capped_while_reading",
    "tests/security/test_sandbox_escape.py::test_process_limit_stops_a_fork_bomb",
    "tests/security/test_sandbox_escape.py::test_sandbox_shows_no_project_snapshots_or_other_trees",
    "tests/security/test_sandbox_escape.py::test_turn_timeout_holds_for_a_running_tool",
    "tests/security/test_symlinks.py",
    "tests/test_bad_input.py::test_non_utf8_steps_jsonl_names_file_and_line",
    "tests/test_bad_input.py::test_root_symlink_loop",
    "tests/test_bad_input.py::test_select_paths_validates_the_tree_first",
    "tests/test_bad_input.py::test_select_roots_refuses_a_fifo_in_a_snapshot",
    "tests/test_bad_input.py::test_temp_folders_removed_after_a_run_and_after_a_failure",
    "tests/test_bad_input.py::test_temp_folders_removed_on_sigterm_and_after_kill_9",
    "tests/test_conventions_lint.py",
    "tests/test_conventions_types.py",
    "tests/test_conventions_workflow.py::test_every_job_rule_has_log_and_conda_env",
    "tests/test_conventions_workflow.py::test_long_rules_have_benchmark",
    "tests/test_conventions_workflow.py::test_profile_keys_are_real_options",
    "tests/test_conventions_workflow.py::test_profile_loads_in_a_dry_run",
    "tests/test_edge_native_end_to_end.py",
    "tests/test_examples_graders.py::test_circle_invalid_gives_null",
    "tests/test_examples_graders.py::test_circle_valid_packing_scores_sum_of_radii",
    "tests/test_examples_graders.py::test_printed_numbers_are_no_score",
    "tests/test_examples_graders.py::test_starting_code_scores_and_constants_matter",
    "tests/test_examples_graders.py::test_tsp_identity_tour_scores_mean_length",
    "tests/test_examples_graders.py::test_tsp_invalid_gives_null",
    "tests/test_examples_snapshots.py::test_stamp_skips_and_output_is_reproducible",
    "tests/test_explore_faults.py",
    "tests/test_explore_log.py",
    "tests/test_explore_resume.py::test_kill_9_then_resume",
    "tests/test_explore_resume.py::test_width1_fixed_seed_is_reproducible_and_edge_budget",
    "tests/test_explore_rules.py::test_depth2_exempt_depth3_pruned_and_no_room",
    "tests/test_explore_rules.py::test_depth3_tool_error_rate_boundary_with_scores",
    "tests/test_explore_rules.py::test_good_leaves_stop_lets_running_edge_finish",
    "tests/test_explore_rules.py::test_layer1_fallback_token_and_depth_leaves",
    "tests/test_explore_teacher_faults.py",
    "tests/test_export_consumers.py",
    "tests/test_export_merged.py::test_a_long_session_is_one_record_whose_cost_grows_linearly",
    "tests/test_export_merged.py::test_a_template_that_rewrites_earlier_turns_cuts_the_run",
    "tests/test_export_merged.py::test_cli_and_merge_write_the_merged_form",
    "tests/test_export_merged.py::test_merged_processes_a_fraction_of_the_step_forms_tokens",
    "tests/test_export_merged.py::test_merged_trains_each_step_completion_once_in_its_context[student]",
    "tests/test_export_sft.py::test_backend_and_coral_in_metadata_and_refuse_native",
    "tests/test_export_sft.py::test_cli_export_and_merge",
    "tests/test_export_sft.py::test_each_ill_formed_kind_stays_in_the_history_and_is_never_trained",
    "tests/test_export_sft.py::test_path_records",
    "tests/test_export_sft.py::test_schema_check_with_seen_messages_matches_the_full_check",
    "tests/test_export_sft.py::test_step_records",
    "tests/test_export_student.py::test_gguf_tokenizer_matches_the_models_own_ids",
    "tests/test_live_tree_reload.py::test_every_save_reloads_exactly",
    "tests/test_nativetools_confinement.py::test_bwrap_confines_the_shell",
    "tests/test_nativetools_confinement.py::test_failed_knowledge_read_is_no_knowledge_action[bwrap]",
    "tests/test_nativetools_confinement.py::test_file_tools_refuse_paths_outside",
    "tests/test_nativetools_confinement.py::test_tool_errors_and_non_errors",
    "tests/test_paths_select.py::test_cli_writes_paths_json",
    "tests/test_proxy_recording.py::test_reply_shapes_are_recorded_as_the_native_client_reads_them[stream]",
    "tests/test_records_single_owner.py::test_one_module_names_each_record_file[messages.jsonl]",
    "tests/test_records_stage_imports.py::test_package_imports_only_its_floor_or_below[teacher]",
    "tests/test_report_html.py::test_report_cli",
    "tests/test_report_html.py::test_report_reads_the_figures_the_merge_wrote_not_the_records",
    "tests/test_report_html.py::test_report_without_sft_or_paths",
    "tests/test_report_trust.py::test_cli_merge_dedupe_flag",
    "tests/test_report_trust.py::test_report_and_card_count_untrained_steps_and_flag_the_backend",
    "tests/test_report_trust.py::test_report_shows_trust",
    "tests/test_roots_fastread.py::test_plot_of_a_long_run_keeps_roots_and_bands_and_stays_small",
    "tests/test_roots_links.py::test_bad_root_links_record_names_the_field",
    "tests/test_roots_links.py::test_explore_grows_a_tree_from_a_linked_root",
    "tests/test_roots_links.py::test_unsupported_files_are_refused_by_explore_through_the_links",
    "tests/test_roots_select.py::test_console_script_exit_status_and_message",
    "tests/test_roots_select.py::test_default_symlinks_roots_and_explore_never_writes_through",
    "tests/test_roots_select.py::test_hardlink_mode_is_self_contained_and_never_touches_the_input",
    "tests/test_runtime_catfile.py::test_many_objects_a_round_trip_and_a_missing_one",
    "tests/test_runtime_coral.py::test_eval_commits_grades_and_records",
    "tests/test_runtime_coral.py::test_eval_from_inside_the_sandbox_and_grader_untouchable",
    "tests/test_runtime_coral.py::test_failed_grading_gives_no_score",
    "tests/test_runtime_coral.py::test_minimize_direction",
    "tests/test_runtime_coral.py::test_the_grader_gets_exactly_the_commit",
    "tests/test_runtime_remove.py::test_a_hostile_tree_goes_and_nothing_outside_it",
    "tests/test_runtime_remove.py::test_the_owner_removes_its_mode_000_folders_without_root",
    "tests/test_runtime_workspace.py::test_a_fork_reuses_parked_attempt_records_moved_by_the_difference",
    "tests/test_runtime_workspace.py::test_the_agents_repository_holds_the_hosts_commits_with_their_ids",
    "tests/test_teacher_client_over_http.py::test_cli_serves_until_stopped",
    "tests/test_teacher_launch_config.py::test_config_schema_takes_launch_and_tool_choice",
    "tests/test_teacher_launch_config.py::test_config_schema_takes_the_stream_keys_and_the_qwen_example",
    "tests/test_teacher_outage.py::test_config_takes_outage_timeout",
    "tests/test_teacher_stream.py::test_a_tree_whose_requests_stall_and_are_cut_finishes_with_each_step_once",
    "tests/test_world_cli.py::test_standin_cli_needs_no_sftree",
    "tests/test_world_grading.py::test_grader_failures_and_timeouts",
    "tests/test_world_sandbox_cli.py",
)


def _base(nodeid: str) -> str:
    return nodeid.split("[", 1)[0]


def is_measured_slow(nodeid: str) -> bool:
    return any(nodeid == e or _base(nodeid) == e or nodeid.startswith(e + "::") for e in MEASURED)


# The command README.md names for the fast tier (tests/test_readme_commands.py, tests/test_conventions_fast_tier.py)
FAST_COMMAND = '.venv/bin/python -m pytest -q -m "not slow"'
