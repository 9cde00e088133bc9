Bnet.layer2.0.downsample.1.biasJ@E&<`3O<>ç»£8±»g£ <†74½·Ò¦<_•U<·>X<÷À¼
;óK½zèà<\ò<ÛI»`SC<