//! Per-GPU busy-time and SM-time accounting.

/// Accumulates, for one GPU, the time during which any work ran on it and the
/// SM-time (seconds × share of SMs) its work used.
#[derive(Clone, Debug, Default)]
pub(crate) struct GpuMeter {
    active: u32,
    since: f64,
    busy: f64,
    sm: f64,
}

impl GpuMeter {
    /// A piece of work starts on this GPU at `now`.
    pub(crate) fn begin(&mut self, now: f64) {
        if self.active == 0 {
            self.since = now;
        }
        self.active += 1;
    }

    /// A piece of work ends at `now`.
    pub(crate) fn end(&mut self, now: f64) {
        debug_assert!(self.active > 0);
        self.active = self.active.saturating_sub(1);
        if self.active == 0 {
            self.busy += now - self.since;
        }
    }

    /// Add SM-time (seconds × SM share).
    pub(crate) fn add_sm_time(&mut self, t: f64) {
        self.sm += t.max(0.0);
    }

    pub(crate) fn busy_time(&self) -> f64 {
        self.busy
    }

    pub(crate) fn sm_time(&self) -> f64 {
        self.sm
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_work_counts_once() {
        let mut m = GpuMeter::default();
        m.begin(0.0);
        m.begin(1.0);
        m.end(2.0);
        m.end(3.0);
        m.begin(5.0);
        m.end(6.0);
        assert_eq!(m.busy_time(), 4.0);
    }
}
