//! Whisper's log-mel spectrogram: 16 kHz mono, 25-ms Hann window (n_fft 400), 10-ms
//! hop (160), Slaney-style mel filters up to 8 kHz, `log10`, dynamic range clamped to
//! 8 (80 dB), scaled `(x + 4) / 4` — the constants of OpenAI Whisper's `audio.py` and
//! the HF `WhisperFeatureExtractor`. The FFT is `rustfft`'s.

use rustfft::num_complex::Complex32;
use rustfft::FftPlanner;

/// Sample rate Whisper expects, Hz.
pub const SAMPLE_RATE: u32 = 16_000;
/// FFT size (25 ms at 16 kHz).
pub const N_FFT: usize = 400;
/// Hop between frames (10 ms at 16 kHz): 100 mel frames per second.
pub const HOP: usize = 160;

/// Slaney mel scale (librosa `hz_to_mel(htk=False)`): linear below 1 kHz, log above.
fn hz_to_mel(f: f64) -> f64 {
    let (f_sp, min_log_hz) = (200.0 / 3.0, 1000.0);
    let min_log_mel = min_log_hz / f_sp;
    let logstep = (6.4f64).ln() / 27.0;
    if f >= min_log_hz {
        min_log_mel + (f / min_log_hz).ln() / logstep
    } else {
        f / f_sp
    }
}

fn mel_to_hz(m: f64) -> f64 {
    let (f_sp, min_log_hz) = (200.0 / 3.0, 1000.0);
    let min_log_mel = min_log_hz / f_sp;
    let logstep = (6.4f64).ln() / 27.0;
    if m >= min_log_mel {
        min_log_hz * (logstep * (m - min_log_mel)).exp()
    } else {
        f_sp * m
    }
}

/// Triangular mel filters `[n_mels][N_FFT/2 + 1]`, Slaney area normalisation
/// (librosa `filters.mel(sr=16000, n_fft=400, n_mels, fmin=0, fmax=8000)`).
pub fn mel_filters(n_mels: usize) -> Vec<Vec<f32>> {
    let bins = N_FFT / 2 + 1;
    let fmax = f64::from(SAMPLE_RATE) / 2.0;
    let (lo, hi) = (hz_to_mel(0.0), hz_to_mel(fmax));
    let pts: Vec<f64> = (0..n_mels + 2)
        .map(|i| mel_to_hz(lo + (hi - lo) * i as f64 / (n_mels + 1) as f64))
        .collect();
    let fft_freq: Vec<f64> = (0..bins)
        .map(|k| k as f64 * f64::from(SAMPLE_RATE) / N_FFT as f64)
        .collect();
    (0..n_mels)
        .map(|m| {
            let (l, c, r) = (pts[m], pts[m + 1], pts[m + 2]);
            let norm = 2.0 / (r - l);
            fft_freq
                .iter()
                .map(|&f| {
                    let up = (f - l) / (c - l);
                    let down = (r - f) / (r - c);
                    (up.min(down).max(0.0) * norm) as f32
                })
                .collect()
        })
        .collect()
}

/// Log-mel spectrogram of `samples` (16 kHz mono), zero-padded or cut to
/// `frames * HOP` samples first.
///
/// # Shapes
/// Output `[n_mels * frames]`, row-major `[n_mels, frames]`.
pub fn log_mel(samples: &[f32], n_mels: usize, frames: usize) -> Vec<f32> {
    let n = frames * HOP;
    let mut x: Vec<f32> = samples.iter().copied().take(n).collect();
    x.resize(n, 0.0);
    // Centre frames with reflect padding of N_FFT/2 on both sides (torch.stft center=True).
    let pad = N_FFT / 2;
    let reflect = |i: isize| -> f32 {
        let len = n as isize;
        if len <= 1 {
            return x.first().copied().unwrap_or(0.0);
        }
        let mut j = i;
        while j < 0 || j >= len {
            j = if j < 0 { -j } else { 2 * (len - 1) - j };
        }
        x[j as usize]
    };
    let window: Vec<f32> = (0..N_FFT)
        .map(|i| 0.5 - 0.5 * (2.0 * std::f32::consts::PI * i as f32 / N_FFT as f32).cos())
        .collect();
    let filters = mel_filters(n_mels);
    let fft = FftPlanner::<f32>::new().plan_fft_forward(N_FFT);
    let bins = N_FFT / 2 + 1;
    let mut out = vec![0f32; n_mels * frames];
    let mut buf = vec![Complex32::new(0.0, 0.0); N_FFT];
    let mut power = vec![0f32; bins];
    for t in 0..frames {
        let start = (t * HOP) as isize - pad as isize;
        for (i, b) in buf.iter_mut().enumerate() {
            *b = Complex32::new(reflect(start + i as isize) * window[i], 0.0);
        }
        fft.process(&mut buf);
        for (p, b) in power.iter_mut().zip(&buf) {
            *p = b.norm_sqr();
        }
        for (m, f) in filters.iter().enumerate() {
            let e: f32 = f.iter().zip(&power).map(|(w, p)| w * p).sum();
            out[m * frames + t] = e.max(1e-10).log10();
        }
    }
    let max = out.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for v in &mut out {
        *v = (v.max(max - 8.0) + 4.0) / 4.0;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mel_scale_round_trips_and_filters_cover_the_band() {
        for f in [0.0, 440.0, 1000.0, 4000.0, 8000.0] {
            assert!((mel_to_hz(hz_to_mel(f)) - f).abs() < 1e-6);
        }
        let fb = mel_filters(80);
        assert_eq!((fb.len(), fb[0].len()), (80, 201));
        assert!(fb.iter().all(|row| row.iter().any(|&w| w > 0.0)));
    }

    #[test]
    fn a_tone_peaks_in_the_mel_bin_of_its_frequency() {
        let sr = SAMPLE_RATE as f32;
        let tone: Vec<f32> = (0..16_000)
            .map(|i| (2.0 * std::f32::consts::PI * 1000.0 * i as f32 / sr).sin())
            .collect();
        let mel = log_mel(&tone, 80, 100);
        let energy = |m: usize| mel[m * 100 + 50];
        let peak = (0..80)
            .max_by(|&a, &b| energy(a).total_cmp(&energy(b)))
            .unwrap();
        // 1 kHz on the Slaney scale is mel 15; with 80 bands up to 8 kHz (mel ~45.2)
        // the band centred nearest is (15/45.2)*81 - 1 ~ 26.
        assert!((25..=27).contains(&peak), "peak band {peak}");
    }
}
