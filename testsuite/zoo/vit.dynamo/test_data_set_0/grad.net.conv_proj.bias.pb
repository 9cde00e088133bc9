 Bnet.conv_proj.biasJ€nxh¼gïh½Œö9¼^X–=é½Ww†»j³<yS¼1š½¤ï½QT„¼ÂÑ<0d¢¹á<Go½™bœ<bbŸ=°]¼0wí¼V6"<==ŽNŠ»ÄÑe<áˆ<¾Ân=nËV½a¹ÿ¼n
=ãBà;/­<àü%8mAÐ;