"""The torchvision classification families of issue 13, small and with trained-looking BatchNorm.

Each entry builds a torchvision model with random weights (seeded), then gives every
BatchNorm running statistics as after training: the statistics of a few random batches
run through the model in training mode (momentum None: the exact averages), and affine
weights away from 1 and 0; the model comes back in eval mode. Families whose smallest
variant is slow privately are built through torchvision's own builder classes with smaller
widths or depths (the `note` says which).
"""

from __future__ import annotations

from functools import partial

import torch

NUM_CLASSES = 10


def _calibrate(model: torch.nn.Module, shape: tuple, seed: int) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)  # test model only, not cryptographic
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    with torch.no_grad():
        for m in model.modules():  # ViT's head starts at zero (constant logits): give it weights
            if isinstance(m, torch.nn.Linear) and not m.weight.any():
                m.weight.normal_(0.0, 0.1, generator=gen)
        for m in norms:
            m.reset_running_stats()
            m.momentum = None  # cumulative average over the calibration batches
            if m.affine:
                m.weight.uniform_(0.5, 1.5, generator=gen)
                m.bias.uniform_(-0.3, 0.3, generator=gen)
        model.train()
        for _ in range(3):
            model(torch.randn((8, *shape[1:]), generator=gen))
    for m in norms:
        m.momentum = 0.1
    return model.eval()


def _make(build, shape: tuple, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)  # test model weights only, not cryptographic
    return _calibrate(build(), shape, seed)


def _families() -> dict:
    from torchvision import models as tv
    from torchvision.models import efficientnet as eff
    from torchvision.models import resnet, swin_transformer as swin, vision_transformer as vit

    small_efficientnet = partial(eff.EfficientNet, [
        eff.MBConvConfig(1, 3, 1, 16, 8, 1, 1.0, 1.0),
        eff.MBConvConfig(4, 3, 2, 8, 16, 2, 1.0, 1.0),
        eff.MBConvConfig(4, 5, 2, 16, 24, 1, 1.0, 1.0),
    ], dropout=0.2, stochastic_depth_prob=0.2, num_classes=NUM_CLASSES, last_channel=64)
    small_efficientnet_v2 = partial(eff.EfficientNet, [
        eff.FusedMBConvConfig(1, 3, 1, 16, 16, 1),
        eff.FusedMBConvConfig(4, 3, 2, 16, 24, 2),
        eff.MBConvConfig(4, 3, 2, 24, 32, 1, 1.0, 1.0),
    ], dropout=0.2, stochastic_depth_prob=0.2, num_classes=NUM_CLASSES, last_channel=64)
    return {
        # name: (builder, input shape, note)
        "resnet": (partial(tv.resnet18, num_classes=NUM_CLASSES), (1, 3, 32, 32), "resnet18"),
        "resnext": (partial(resnet.ResNet, resnet.Bottleneck, [1, 1, 1, 1], groups=4, width_per_group=8,
                            num_classes=NUM_CLASSES), (1, 3, 32, 32),
                    "ResNet(Bottleneck, [1, 1, 1, 1], groups=4, width_per_group=8): resnext50_32x4d's "
                    "blocks, one per stage, 1/4 width"),
        "wide_resnet": (partial(resnet.ResNet, resnet.Bottleneck, [1, 1, 1, 1], width_per_group=128,
                                num_classes=NUM_CLASSES), (1, 3, 32, 32),
                        "ResNet(Bottleneck, [1, 1, 1, 1], width_per_group=128): wide_resnet50_2's "
                        "blocks, one per stage"),
        "mobilenet_v2": (partial(tv.mobilenet_v2, num_classes=NUM_CLASSES), (1, 3, 32, 32), "mobilenet_v2"),
        "mobilenet_v3": (partial(tv.mobilenet_v3_small, num_classes=NUM_CLASSES), (1, 3, 32, 32),
                         "mobilenet_v3_small"),
        "efficientnet": (small_efficientnet, (1, 3, 32, 32),
                         "EfficientNet with 3 MBConv stages (SiLU, squeeze-excitation, stochastic depth)"),
        "efficientnet_v2": (small_efficientnet_v2, (1, 3, 32, 32),
                            "EfficientNet with FusedMBConv and MBConv stages (efficientnet_v2's blocks)"),
        "regnet": (partial(tv.regnet_y_400mf, num_classes=NUM_CLASSES), (1, 3, 32, 32), "regnet_y_400mf"),
        "squeezenet": (partial(tv.squeezenet1_1, num_classes=NUM_CLASSES), (1, 3, 64, 64), "squeezenet1_1"),
        "shufflenet_v2": (partial(tv.shufflenet_v2_x0_5, num_classes=NUM_CLASSES), (1, 3, 32, 32),
                          "shufflenet_v2_x0_5"),
        "mnasnet": (partial(tv.mnasnet0_5, num_classes=NUM_CLASSES), (1, 3, 32, 32), "mnasnet0_5"),
        "densenet": (partial(tv.DenseNet, growth_rate=8, block_config=(2, 2, 2, 2), num_init_features=16,
                             num_classes=NUM_CLASSES), (1, 3, 32, 32),
                     "DenseNet(growth_rate=8, block_config=(2, 2, 2, 2), num_init_features=16)"),
        "convnext": (partial(tv.convnext.ConvNeXt, [
            tv.convnext.CNBlockConfig(16, 32, 1), tv.convnext.CNBlockConfig(32, 64, 1),
            tv.convnext.CNBlockConfig(64, None, 1)], stochastic_depth_prob=0.1, num_classes=NUM_CLASSES),
            (1, 3, 32, 32), "ConvNeXt with 3 stages of one CNBlock (16/32/64 channels)"),
        "vit": (partial(vit.VisionTransformer, image_size=32, patch_size=8, num_layers=2, num_heads=2,
                        hidden_dim=32, mlp_dim=64, num_classes=NUM_CLASSES), (1, 3, 32, 32),
                "VisionTransformer(image_size=32, patch_size=8, 2 layers, 2 heads, hidden 32, mlp 64)"),
        "swin": (partial(swin.SwinTransformer, patch_size=[2, 2], embed_dim=16, depths=[2, 2], num_heads=[2, 2],
                         window_size=[4, 4], stochastic_depth_prob=0.1, num_classes=NUM_CLASSES), (1, 3, 32, 32),
                 "SwinTransformer(patch_size=2, embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=4): "
                 "shifted windows and patch merging as swin_t"),
        "maxvit": (partial(tv.MaxVit, input_size=(32, 32), stem_channels=8, partition_size=2,
                           block_channels=[16, 32], block_layers=[1, 1], head_dim=8, stochastic_depth_prob=0.1,
                           num_classes=NUM_CLASSES), (1, 3, 32, 32),
                   "MaxVit(stem_channels=8, partition_size=2, block_channels=[16, 32], block_layers=[1, 1], "
                   "head_dim=8): MBConv, block and grid attention as maxvit_t"),
    }


FAMILIES = ["resnet", "resnext", "wide_resnet", "mobilenet_v2", "mobilenet_v3", "efficientnet",
            "efficientnet_v2", "regnet", "squeezenet", "shufflenet_v2", "mnasnet", "densenet",
            "convnext", "vit", "swin", "maxvit"]


def build(name: str, seed: int = 0, size: int | None = None) -> tuple[torch.nn.Module, tuple, str]:
    """The family's model, its input shape (`size` x `size` images if given: the BatchNorm
    statistics are those of that size) and a note on the configuration."""
    make, shape, note = _families()[name]
    if size is not None:
        shape = (*shape[:2], size, size)
        if name == "maxvit":  # its attention grids follow the image size
            make = partial(make, input_size=(size, size))
    return _make(make, shape, seed), shape, note
