
B	head.biasJ(œÊh=À½x<ôl¼Ãå&=„ĞF½Øes¼6P>=¢Ê´=|v—=ò€y¾