import gc
import os
import re
from pathlib import Path

import pytest


def pytest_configure(config):
    """Compiled programs go to the checkout's own ``.test-cache`` (git-ignored) from the start, before any
    fixture: the library switches JAX's persistent cache on in its folder at its first use, once per process, and
    a test module that uses a kernel at import pointed it at the user's own ~/.cache/napari-gridmip for the whole
    run. Kept across runs, as that folder was (the README's command: 8.6 min with it warm, 16.3 min cold, 7a9fe54)."""
    folder = Path(config.rootpath) / ".test-cache"
    os.environ.setdefault("NAPARI_GRIDMIP_CACHE_DIR", str(folder))


@pytest.fixture(autouse=True)
def _isolated_user_folders(tmp_path_factory, monkeypatch):
    """Widget settings and compiled programs go to temporary folders, never the user's."""
    monkeypatch.setenv("NAPARI_GRIDMIP_CONFIG_DIR", str(tmp_path_factory.mktemp("config")))
    monkeypatch.setenv("NAPARI_GRIDMIP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    # kept executables are keyed without tracing, so a strategy a test replaces would not reach them
    # (core/runtime/executables.py); tests/core/test_executables.py turns them on
    monkeypatch.setenv("NAPARI_GRIDMIP_EXECUTABLE_CACHE", "0")


@pytest.fixture(autouse=True)
def _earlier_objects_frozen():
    """Python's full garbage collections during a test scan only the objects made since it began.

    napari's ``make_napari_viewer`` runs a full ``gc.collect()`` after each test, which scans every object of
    the process: JAX's caches hold millions once a worker has run a few modules, and each of those
    collections then took 1.5 to 7 s (690 s of the suite's 1860, all in teardowns). Frozen, the objects that
    were there before the test are left out of them (``gc.freeze``), and are scanned again from its end on.
    """
    gc.freeze()
    yield
    gc.unfreeze()


# The default run's budget: the README's command within 5 minutes on a 2-core machine with an empty compile cache.
# Most of a cold run is XLA compiling, 0.1 to 5 s per program, and each new shape, option or forced
# backend strategy is a new program; so the cases below, each of which compiles programs of its own for many
# seconds (a per-test measurement of a cold run: CPU seconds and JAX compile time), are marked slow here.
# Each feature keeps faster cases in the default run (every public function, widget, CLI command and sample);
# `python -m pytest -m slow`, which .ci/run runs too, runs these. An entry without parameters marks every
# parametrisation of its test; `*` in an entry stands for any characters.
SLOW_CASES = {
    "napari_gridmip/core/correlation/tracking.py": [
        "napari_gridmip.core.correlation.tracking.track_speckles",
    ],
    "tests/cli/test_correlate_series.py": [
        # test_one_csv_per_frame keeps the command in the default run; each case is a new process importing JAX
        "test_bad_input_is_one_line_and_writes_nothing[args0-*",
        "test_bad_input_is_one_line_and_writes_nothing[args2-*",
        "test_bad_input_is_one_line_and_writes_nothing[args3-*",
        "test_bad_input_is_one_line_and_writes_nothing[args5-*",
    ],
    "tests/cli/test_prepare.py": [
        # the marker, the bad combinations and the background start stay in the default run with jobs that compile
        # nothing; this one runs the real preparation (every widget's sample job, about 40 s on 2 cores)
        "test_prepare_end_to_end_then_a_first_dic_run_compiles_nothing_large",
    ],
    "tests/core/correlation/test_affine.py": [
        # the IC-GN solution test keeps the affine fields in the default run; the rest compile bands of their own
        "test_affine_subsets_meet_the_targets",
        "test_dask_stacks_give_the_in_memory_result",
        "test_the_ic_gn_programs_compile_ahead_and_once",
        "test_points_the_windows_do_not_serve_take_the_gathers_band",
        "test_the_accelerators_ic_gn_gives_the_cpus_field",
        "test_the_grid_reads_give_the_windows_field",
        "test_tile_windows_are_the_slices",
        "test_progress_covers_the_affine_bands_and_stops_between_them",
        "test_grid_subsets_are_the_windows_subsets",
        "test_one_ic_gn_program_serves_every_prefilter_width",
        "test_windows_ignore_what_is_not_a_tap",
        "test_a_window_out_of_its_tile_is_not_served",
        "test_windowed_interpolation_gives_the_gathers_values[subset1-*",
        "test_windowed_interpolation_gives_the_gathers_values[subset2-*",
        "test_windowed_interpolation_gives_the_gathers_values[subset3-*",
        "test_windowed_interpolation_gives_the_gathers_values[subset5-*",
        "test_strain_of_the_subsets_gradients",
        "test_noise_free_gradients_are_exact_per_point",
        "test_gradient_spread_is_the_predicted_noise",
    ],
    "tests/core/correlation/test_fields.py": [
        "test_holes_in_a_harmonic_surface_are_filled_exactly[forward-float32-*",
        "test_strain_equals_a_plane_fit_loop[numpy-shape3-window3-small]",
        "test_strain_equals_a_plane_fit_loop[jax-shape1-window1-green-lagrange]",
        "test_dask_is_lazy_and_equal[least-squares]",
        "test_batch_axes_are_independent_images",
        "test_strain_under_jit_and_on_dask[jax]",
        "test_strain_of_a_transposed_field_is_transposed[jax]",
        "test_all_nan_gives_nan_and_one_pixel_gives_zero[least-squares]",
        "test_holes_in_a_harmonic_surface_are_filled_exactly[*float64*]",
        "test_linear_displacement_is_exact_everywhere[jax-float64-*",
        "test_strain_equals_a_plane_fit_loop[jax-shape0-*",
    ],
    "tests/core/correlation/test_maps.py": [
        "test_with_and_without_jit[tiles-True]",
        # the accelerators' sweeps keep the maps and one field search in the default run
        "test_*[*sweeps*]",
        "!test_float32_against_float64_loop[*",
        "test_float64_really_computes_in_float64[*offsets_first*]",
        "!test_peak_and_integer_offsets_match_the_full_map[sweeps]",
        "test_property_float64_matches_definition",  # its slow twin runs 60 examples
        "test_speckle_default_no_worse_than_numpy",
        "test_speckle_refine_at_least_halves_the_error",
        "test_the_refinements_block_table_gives_the_slices_answer",
        "test_offset_data_keeps_its_variations_in_float32",
        "test_inputs_are_not_modified",
        "test_with_and_without_jit[tiles-False]",
        "test_hessian_matches_a_float64_numpy_implementation",
        "test_long_stacks_find_the_same_peaks[tiles-16]",
        "test_long_stacks_find_the_same_peaks[tiles-50]",
        "test_every_subpixel_method_in_every_precision[*float64]",
        "test_every_subpixel_method_in_every_precision[tiles-paraboloid-*",
        "test_peak_on_the_window_edge_is_flagged_not_clipped",
        "test_nan_poisons_only_the_pairs_that_use_it",
        "test_every_subpixel_method_in_every_precision[tiles-hessian-float32]",
        "test_batch_axes",
    ],
    "tests/core/correlation/test_prefilter.py": [
        "test_dask_stacks_give_the_in_memory_result",
        "test_auto_is_refine_on_both_images_smoothed_by_scipy",
        "test_default_refine_has_no_noise_bias_on_a_smooth_field",
        "test_smooth_frames_keeps_constants_and_commutes_with_offsets",
        "test_uncertainty_matches_the_spread_with_the_prefilter",
    ],
    "tests/core/correlation/test_series_policies.py": [
        # a 60-frame sequence (11 s to make and run); the rigid warp's test and test_series.py's policy cases stay
        "test_incremental_drifts_at_most_twice_accumulated",
        "test_auto_keeps_every_point_accumulated_keeps",
    ],
    "tests/core/correlation/test_volumes.py": [
        # slabs against the whole volume: the plain 64^3 case stays in the default run; these compile their own
        "test_dask_volumes_read_by_slabs_give_the_answers_in_memory[shape1-True]",
        "test_dask_volumes_read_by_slabs_give_the_answers_in_memory[shape2-False]",
    ],
    "tests/core/correlation/test_series.py": [
        "test_reference_policies_agree_on_a_growing_stretch[incremental]",
        "test_large_translations_are_found_and_lost_points_say_so",
        "test_rotation_in_20_degree_steps_inside_a_mask",
        "test_pixels_outside_the_roi_never_enter_a_match",
    ],
    "tests/core/correlation/test_subsets.py": [
        "test_map_float64_against_float64_loop[K2-17x19-*",
        "test_map_float64_against_float64_loop[K3-*",
        "test_map_float64_against_float64_loop[K1-*",
        "test_windows_are_numpy_slices",
        "test_take_block_is_numpy_indexing",
        # the accelerators' strategies forced on the CPU (selects, row batches, fresh and all-rows sums) and jit
        "test_the_selects_read_the_blocks_the_gathers_read",
        "test_rows_in_small_batches_give_one_batchs_fields",
        "test_with_and_without_jit",
        "test_both_row_sum_strategies_give_the_definition",
        "test_track_sign_convention",
        "test_a_first_call_compiles_its_band_program_ahead_and_once",
        "test_step_is_the_dense_result_subsampled[2]",
        "test_every_subpixel_method_in_every_precision_with_subsets[*float64]",
        "test_every_subpixel_method_in_every_precision_with_subsets[paraboloid-*",
        "test_uncertainty_predicts_the_spread",
        "test_columns_by_phase_are_the_strided_columns",
        "test_track_recovers_known_transmission_dark_field_and_shift",
        "test_dask_is_lazy_and_equals_in_memory",
        "test_inputs_are_not_modified",
        "test_nan_poisons_only_what_uses_it",
        "test_property_float64_matches_definition",
        "test_refine_maximises_the_interpolated_correlation",
        "test_peak_on_the_window_edge_is_flagged",
        "test_offset_data_keeps_its_variations_in_float32",
        "test_integer_peaks_and_hessian_match_the_definition",
        "test_step_is_the_dense_result_subsampled[3]",
    ],
    "tests/core/correlation/test_timeseries.py": [
        "test_against_the_definition[5-4]",
        "test_transposing_the_frames_transposes_the_image",
        "test_batch_axes",
        "test_against_the_definition[5-8]",
        "test_against_the_definition[None-8]",
    ],
    "tests/core/occupancy/test_chunk_files.py": [
        "test_a_render_through_the_files_equals_the_in_memory_one",
    ],
    "tests/core/occupancy/test_max.py": [
        "test_dask_is_lazy_and_equal[shape1-chunks1-float16]",
        "test_property_threshold_of_max_is_occupancy",
    ],
    "tests/core/occupancy/test_packing.py": [
        "test_property_round_trip",
    ],
    "tests/core/occupancy/test_pyramid.py": [
        "test_property_matches_reference",
        "test_property_monotone_and_consistent",
    ],
    "tests/core/occupancy/test_queries.py": [
        "test_bbox_matches_scan[shape3]",
    ],
    "tests/core/occupancy/test_raycast.py": [
        "test_the_cache_keeps_only_the_occupied_cells_of_the_chunks_it_reads",
        "test_a_new_camera_state_compiles_nothing",
        "test_mip_skipping_gives_the_image_of_every_segment_read",
        "test_the_segments_read_are_exactly_those_whose_samples_read_an_occupied_cell",
        "test_mip_skips_only_segments_that_cannot_reach_the_maximum",
        "test_a_small_cache_renders_in_bands_with_the_same_image[attenuated_mip]",
        "test_a_small_cache_renders_in_bands_with_the_same_image[minip]",
        "test_a_small_cache_renders_in_bands_with_the_same_image[iso]",
        "test_any_chunking_renders_the_same_image[chunks0]",
        "test_equals_a_dense_numpy_ray_cast[attenuated_mip-orthographic]",
        "test_equals_a_dense_numpy_ray_cast[minip-orthographic]",
        "test_a_cache_sees_an_occupancy_grid_changed_in_place[in place]",
        "test_a_pool_kept_on_the_device_gives_the_same_image[attenuated_mip]",
        "test_equals_a_dense_numpy_ray_cast[attenuated_mip-perspective]",
        "test_equals_a_dense_numpy_ray_cast[minip-perspective]",
        "test_any_chunking_renders_the_same_image[3]",
        "test_a_cache_sees_an_occupancy_grid_changed_in_place[a copy changed]",
    ],
    "tests/core/occupancy/test_render.py": [
        "test_compacted_batches_give_the_same_image",
        "test_dask_reads_only_the_chunks_with_occupied_voxels_on_the_rays",
        "test_dtypes[float64]",
        "test_dtypes[float16]",
        "test_dtypes[int16]",
        "test_dtypes[bfloat16]",
        "test_levels_from_level_1_give_the_whole_pyramids_picture",
        "test_mip_matches_the_dense_mip[shape1-uint8]",
        "test_first_hit_matches_the_reference[0.9]",
    ],
    "tests/core/occupancy/test_traverse.py": [
        "test_a_ring_of_records_gives_the_scatters_records",
        "test_a_ring_of_records_gives_the_scatters_records[32-5]",
        "test_a_ring_of_records_gives_the_scatters_records[3-2]",
        "test_a_ring_of_records_gives_the_scatters_records[1-64]",
        "test_a_ring_of_records_gives_the_scatters_records[3-1]",
        "test_compaction_gives_the_same_voxels",
        "test_overflow_continues_and_batches_agree",
        "test_float64_and_a_single_ray_shape",
    ],
    "tests/core/patches/test_fuse.py": [
        "test_dtypes[int32]",
        "test_dtypes[float64]",
    ],
    "tests/core/patches/test_grid.py": [
        "test_round_trip_every_stride_up_to_the_patch[3]",
        "test_property_round_trip_and_reference",
        "test_round_trip_every_stride_up_to_the_patch[1]",
    ],
    "tests/core/patches/test_stitch.py": [
        "test_3d_tiles_quadratic",
        "test_pair_ncc_equals_the_loop[shape0]",  # [shape1] stays
    ],
    "tests/core/patches/test_stitch_engines.py": [
        # test_engines_agree_on_whole_mosaics[grid0-...] stays: the JAX engine's register_tiles in the default run
        "test_numpy_kernel_equals_jax[shape2-*",
        "test_numpy_kernel_equals_jax[shape4-*",
        "test_numpy_kernel_equals_jax[shape5-*",
    ],
    "tests/core/patches/test_stitch_search.py": [
        # the broad band's NumPy case and the lattice with spots stay; these compile the JAX engine's programs
        "test_engines_agree_on_the_lattice",
        "test_weak_pairs_are_found_in_the_broad_band[jax]",
    ],
    "tests/cli/test_stitch_mosaic.py": [
        # two of the five bad inputs stay (a missing file, a bad TileConfiguration line); each case is a new process
        "test_bad_input_is_one_line_and_writes_nothing[args0-*",
        "test_bad_input_is_one_line_and_writes_nothing[args1-*",
        "test_bad_input_is_one_line_and_writes_nothing[args4-*",
        "test_an_existing_registered_configuration_is_kept",
    ],
    "tests/core/test_chunked.py": [
        "test_correlation_offsets_first_in_row_chunks",
        "test_mipmap_equals_in_memory[shape2-chunks2]",
        "test_correlation_equals_in_memory[chunks0]",
        "test_correlation_equals_in_memory[chunks2]",
        "test_correlation_batch_axes",
        "test_merge_equals_in_memory[37-*",
        "test_merge_equals_in_memory[64-hann]",
        "test_merge_equals_in_memory[64-overwrite]",
        "test_mipmap_equals_in_memory[shape3-chunks3]",
        "test_correlation_equals_in_memory[chunks1]",
        "test_merge_equals_in_memory[64-gaussian]",
        "test_merge_equals_in_memory[64-mean]",
    ],
    "tests/core/test_dtypes.py": [
        "test_correlation[float64-*",
        "!test_correlation[float64-float*",
        "test_correlation[float32-int16]",
        "test_correlation[float32-int32]",
        "test_correlation[float32-uint8]",
        "test_correlation[float32-uint32]",
        "test_merge_round_trip[gaussian-*",
        "test_merge_round_trip[max-*",
        "test_merge_round_trip[overwrite-*",
    ],
    "tests/core/test_executables.py": [
        # test_a_later_process_loads_both_programs_and_traces_neither keeps the kept executables in the default run
        "test_programs_read_from_jaxs_cache_are_not_kept",
        "test_dic_and_tracking_give_jits_fields",
        "test_a_later_process_loads_both_programs_and_traces_neither",
    ],
    "tests/io/test_cli.py": [
        "test_bad_input_is_one_line_and_leaves_nothing[args12-*",
        "test_stitch_keeps_an_existing_positions_file",
        # each command keeps a run and the bad inputs two cases (each case is a new process, most importing JAX)
        "test_bad_input_is_one_line_and_leaves_nothing[args1-*",
        "test_bad_input_is_one_line_and_leaves_nothing[args2-*",
        "test_bad_input_is_one_line_and_leaves_nothing[args3-*",
        "test_bad_input_is_one_line_and_leaves_nothing[args4-*",
        "test_bad_input_is_one_line_and_leaves_nothing[args5-*",
        "test_bad_input_is_one_line_and_leaves_nothing[args6-*",
        "test_bad_input_is_one_line_and_leaves_nothing[args7-*",
        "test_bad_input_is_one_line_and_leaves_nothing[args8-*",
        "test_bad_input_is_one_line_and_leaves_nothing[args9-*",
        "test_bad_input_is_one_line_and_leaves_nothing[args10-*",
        "test_bad_input_is_one_line_and_leaves_nothing[args11-*",
        "test_stitch_bad_input_is_one_line",
        "test_correlate_subset_step_and_tracking_outputs",
        "test_mipmap_packed_and_bbox",
        "test_mipmap_packed_with_leading_axes",
        "test_mipmap_bbox_of_nothing",
        "test_scheduler_address_runs_on_a_cluster",
        "test_outputs_carry_their_provenance",
        "test_existing_output_is_kept",
        "test_merge_infers_the_image_shape",
    ],
    "tests/jobs/test_device_layers.py": [
        "test_the_correlation_jobs_give_the_same_layers_from_the_copies",
        "test_the_time_series_job_gives_the_same_image_from_the_copy",
    ],
    "tests/jobs/test_live_source.py": [
        "test_the_warm_up_reads_level_0s_occupied_chunks_and_the_first_view_reads_none",
        "test_a_cancelled_warm_up_leaves_the_programs_to_the_render",
        "test_a_render_waits_for_one_batch_of_the_read_ahead_at_most",
        "test_the_preload_keeps_to_its_bound_and_stops_when_cancelled",
    ],
    "tests/jobs/test_jobs.py": [
        "test_correlation_job_layers_read_together",
        "test_large_full_map_is_written_in_the_worker",
        "test_a_repeated_job_traces_and_compiles_nothing[correlation stacks]",
        "test_lazy_merge_and_correlation_jobs",
    ],
    "tests/jobs/test_plans.py": [
        "test_dic_uncertainty_keeps_the_prefiltered_field",
        "test_affine_subsets_with_strain_from_their_gradients",
        "test_tracking_outputs",
        "test_render[True]",
        "test_strain_and_phase_with_a_step_are_per_pixel",
        "test_render[False]",
    ],
    "tests/sample_data/test_samples.py": [
        "test_dic_pair_is_8_bit_deterministic_and_moved_by_its_field",
    ],
    "tests/test_first_calls.py": [
        # each a new process compiling: test_library_calls_keep_compiled_programs_in_the_per_user_cache stays
        "test_routine_first_calls_compile_no_more_programs_than_budgeted",
        "test_the_cache_can_be_left_off[off]",
        "test_the_users_own_cache_folder_wins",
        "test_the_cache_can_be_left_off[0]",
    ],
    "tests/widgets/test_correlation_widget.py": [
        "test_speckle_contrast_sample_tracks_and_shows_a_clicked_surface",
        "test_dic_sample_with_affine_subsets",
        "test_physical_phase_uses_phase_from_displacement",
        "test_refine_is_cancelled_between_bands",
        "test_run_takes_over_the_job_started_when_the_inputs_settled",
        "test_an_option_changed_after_the_early_job_gives_its_own_result",
    ],
    "tests/widgets/test_device_layers_widget.py": [
        "test_correlation_runs_on_kept_copies_give_the_results_without_them",
    ],
    "tests/widgets/test_gui_soak.py": [
        "test_short_gui_soak_never_hangs_raises_or_leaves_a_thread",
    ],
    "tests/widgets/test_live_render.py": [
        "test_a_layer_with_stored_cells_is_warmed_up_before_the_switch",
        "test_a_new_source_layer_keeps_the_quad_layer",
        "test_each_render_and_the_switch_off_hand_the_freed_pages_back",
        "test_a_warm_up_of_data_replaced_since_is_not_used",
        "test_the_switch_warms_up_one_source_that_the_renders_then_use",
        "test_renders_of_one_source_take_turns_on_its_cache",
    ],
    "tests/widgets/test_mipmap_widget.py": [
        "test_render_cancel_leaves_no_layer",
        "test_crop_of_labels_is_labels",
        "test_lazy_summary_counts_chunks_holding_data",
    ],
    "tests/widgets/test_no_hang.py": [
        # a new napari session per case: one pool size and binding stays
        "test_session_with_a_busy_global_pool_never_hangs[1-pyqt5]",
        "test_session_with_a_busy_global_pool_never_hangs[1-pyqt6]",
        "test_session_with_a_busy_global_pool_never_hangs[2-pyqt5]",
        "test_session_with_a_busy_global_pool_never_hangs[2-pyqt6]",
    ],
    "tests/widgets/test_provenance.py": [
        "test_layers_carry_provenance_and_copy_as_python_remakes_them[correlation]",
        "test_re_runs_replace_their_layers_and_keep_the_users_choices",
    ],
    "tests/widgets/test_public_napari_api.py": [
        "test_the_widgets_run_with_napari_deprecations_as_errors",
    ],
    "tests/widgets/test_soak.py": [
        "test_short_soak_leaves_no_error_and_no_thread",
    ],
    "tests/widgets/test_what_the_user_sees.py": [
        "test_the_canvas_keeps_its_room[CorrelationWidget-*",
    ],
}


def _pattern(entry: str) -> re.Pattern:
    """An entry of SLOW_CASES as a regular expression over a test's name and parameters."""
    body = ".*".join(re.escape(part) for part in entry.split("*"))
    return re.compile(body if "[" in entry else body + r"(\[.*\])?")


_SLOW = {
    module: (
        [_pattern(e) for e in entries if not e.startswith("!")],
        [_pattern(e[1:]) for e in entries if e.startswith("!")],
    )
    for module, entries in SLOW_CASES.items()
}


def is_slow_case(nodeid: str) -> bool:
    """Whether SLOW_CASES marks the test ``nodeid`` (``path::name[parameters]``) slow; an entry starting with ``!``
    keeps the tests it matches in the default run."""
    module, _, name = nodeid.partition("::")
    slow, kept = _SLOW.get(module, ((), ()))
    return any(p.fullmatch(name) for p in slow) and not any(p.fullmatch(name) for p in kept)


@pytest.hookimpl(tryfirst=True)  # before the -m selection, which reads the marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        if is_slow_case(item.nodeid):
            item.add_marker(pytest.mark.slow)
