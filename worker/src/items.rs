//! Host items into device tensors: the one step of input handling that needs
//! burn. Decoding and preprocessing (`easerve_exec::input`) stay on the host.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use easerve_exec::input::HostItem;
use easerve_model::nn::{AnyresImage, AudioClip, EncoderItem, QwenPatches};

/// `item` as a tensor input of the model on `device` (the host values copied
/// once, in the shape [`HostItem`] gives).
pub fn to_device<B: Backend>(item: &HostItem, device: &B::Device) -> EncoderItem<B> {
    match item {
        HostItem::Anyres {
            data,
            shape,
            grid_h,
            grid_w,
            crop_rows,
            crop_cols,
        } => EncoderItem::Anyres(AnyresImage {
            tiles: Tensor::from_data(TensorData::new(data.clone(), *shape), device),
            grid_h: *grid_h,
            grid_w: *grid_w,
            crop_rows: *crop_rows,
            crop_cols: *crop_cols,
        }),
        HostItem::Qwen {
            data,
            shape,
            t,
            grid_h,
            grid_w,
        } => EncoderItem::Qwen(QwenPatches {
            patches: Tensor::from_data(TensorData::new(data.clone(), *shape), device),
            t: *t,
            grid_h: *grid_h,
            grid_w: *grid_w,
        }),
        HostItem::Audio {
            data,
            shape,
            llm_tokens,
        } => EncoderItem::Audio(AudioClip {
            mel: Tensor::from_data(TensorData::new(data.clone(), *shape), device),
            llm_tokens: *llm_tokens,
        }),
    }
}
