//! The executor decides as the simulator does: `easerve exec`'s and `easerve
//! serve`'s command handling against fake workers on a virtual clock
//! (`easerve_exec::agree`, built without any model), beside
//! `drivers_agree.rs`'s harness.

use easerve_exec::agree;

#[test]
fn the_executor_decides_as_the_simulator_with_local_prefill() {
    agree::the_executor_decides_as_the_simulator_with_local_prefill();
}

#[test]
fn the_executor_decides_as_the_simulator_under_time_slicing() {
    agree::the_executor_decides_as_the_simulator_under_time_slicing();
}

#[test]
fn the_executor_fails_what_the_simulator_fails_when_a_worker_dies() {
    agree::the_executor_fails_what_the_simulator_fails_when_a_worker_dies();
}

#[test]
fn the_server_decides_as_the_simulator_with_local_prefill() {
    agree::the_server_decides_as_the_simulator_with_local_prefill();
}

#[test]
fn the_executor_decides_as_the_simulator_for_the_aggregated_system() {
    agree::the_executor_decides_as_the_simulator_for_the_aggregated_system();
}

#[test]
fn the_server_decides_as_the_simulator_for_the_aggregated_system() {
    agree::the_server_decides_as_the_simulator_for_the_aggregated_system();
}

#[test]
fn the_executor_restarts_what_the_simulator_restarts() {
    agree::the_executor_restarts_what_the_simulator_restarts();
}

#[test]
fn the_executor_aborts_what_the_simulator_aborts_at_deadlines() {
    agree::the_executor_aborts_what_the_simulator_aborts_at_deadlines();
}

#[test]
fn the_executor_moves_workers_as_the_simulator_plans() {
    agree::the_executor_moves_workers_as_the_simulator_plans();
}

#[test]
fn the_server_moves_workers_as_the_simulator_plans() {
    agree::the_server_moves_workers_as_the_simulator_plans();
}

#[test]
fn the_executor_hits_and_evicts_as_the_simulator() {
    agree::the_executor_hits_and_evicts_as_the_simulator();
}

#[test]
fn the_executor_hits_and_evicts_as_the_simulator_over_shared_text() {
    agree::the_executor_hits_and_evicts_as_the_simulator_over_shared_text();
}

#[test]
fn the_executor_keeps_serving_while_the_twin_simulates() {
    agree::the_executor_keeps_serving_while_the_twin_simulates();
}

#[test]
fn a_planned_load_that_dies_loading_is_a_failed_change() {
    agree::a_planned_load_that_dies_loading_is_a_failed_change();
}
