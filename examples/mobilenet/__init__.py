"""MobileNetV2 on CIFAR10, CIFAR100 and Food101: the report's vision experiments."""
